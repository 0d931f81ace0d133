"""A window whose inventory names another served model than live serving answers with: before the stop, preflight
reads serving's ``/v1/models`` and refuses when ``serving.served_model_name`` is not listed (the restore's health gate
would wait its whole ``health_timeout_s`` for a name the restored release does not serve, and the stages would read
``model_path``, not the served target). Seen on the sandbox: the demo's SmolLM2 inventory run while serving served
the tests' tiny-llama. Pure: a stand-in executor answers the one read (``curl -s -f URL``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3ops.config import load_inventory
from eagle3ops.window.preflight import Preflight

REPO = Path(__file__).resolve().parents[1]


class _Res:
    def __init__(self, stdout: str = "", ok: bool = True):
        self.stdout, self.stderr, self.ok = stdout, "", ok


class _Serving:
    """Answers ``curl ... /v1/models`` with ``answer`` (None: the request fails, e.g. HTTP 401 under ``-f``)."""

    def __init__(self, answer: str | None):
        self.host = load_inventory(REPO / "deploy/sandbox-smollm2.yaml").host("sandbox")
        self.dry_run, self.answer, self.asked = False, answer, []

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        self.asked.append(list(argv))
        if argv[0] == "curl" and argv[-1].endswith("/v1/models") and self.answer is not None:
            return _Res(self.answer)
        return _Res(ok=False)


def _models(*ids: str) -> str:
    return json.dumps({"object": "list", "data": [{"id": i, "object": "model", "root": f"/models/{i}"} for i in ids]})


def test_a_live_server_without_the_inventorys_model_is_refused_before_the_stop():
    from eagle3ops.window.servedmodel import check_served_model

    r, pf = _Serving(_models("tiny-llama")), Preflight()
    check_served_model(r, pf)
    [(name, ok, detail)] = pf.checks
    text = " ".join(detail.split())
    assert not ok and name == "served model", pf.checks
    assert "['tiny-llama']" in text and "smollm2-135m-instruct" in text, text
    assert "hosts.sandbox.serving.served_model_name" in text and "health_timeout_s" in text, text
    assert "hosts.sandbox.model_path" in text and "nothing was stopped" in text, text


@pytest.mark.parametrize("answer, judged", [
    pytest.param(_models("smollm2-135m-instruct"), True, id="listed"),
    pytest.param(_models("other", "smollm2-135m-instruct"), True, id="listed-among-others"),
    pytest.param(None, False, id="no-answer"),
    pytest.param("not json", False, id="not-json"),
    pytest.param(json.dumps({"object": "list"}), False, id="no-data"),
])
def test_a_listed_model_or_an_unreadable_answer_passes(answer, judged):
    from eagle3ops.window.servedmodel import check_served_model

    r, pf = _Serving(answer), Preflight()
    check_served_model(r, pf)
    [(name, ok, detail)] = pf.checks
    assert ok and name == "served model", pf.checks
    assert ("not judged" not in detail) == judged, detail


def test_preflight_refuses_it_before_the_stop():
    """The check is one of preflight's serving checks (the stand-in host of ``test_window_driver``): its ``/v1/models``
    listing another model fails preflight; listing the inventory's passes."""
    from eagle3ops.window import preflight as wpreflight
    from test_window_driver import IMAGE, IMAGE_ID, StandInRemote, _host_with_serving

    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    for served, ok in ((["smollm2-135m-instruct"], False), ([h.serving.served_model_name], True)):
        world = _host_with_serving(h)
        world.served_models = served
        pf = wpreflight.preflight(StandInRemote(h, world), image=IMAGE, expected_image_id=IMAGE_ID)
        assert pf.ok is ok and next(c for c in pf.checks if c[0] == "served model")[1] is ok, pf.checks


class _Routes(_Serving):
    """Answers ``curl -s -f ... URL`` by the URL's route from ``bodies`` (a route missing: the request fails)."""

    def __init__(self, bodies: dict[str, str]):
        super().__init__(None)
        self.bodies = bodies

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        self.asked.append(list(argv))
        route = "/" + argv[-1].split("/", 3)[-1]
        return _Res(self.bodies[route]) if route in self.bodies else _Res(ok=False)


@pytest.mark.parametrize("body, version, models", [
    pytest.param(None, None, None, id="no-answer"),
    pytest.param("not json", None, None, id="not-json"),
    pytest.param("[1, 2]", None, None, id="json-not-an-object"),
    pytest.param('{"version": "", "data": "x"}', None, None, id="empty-fields"),
    pytest.param('{"version": "0.16.0+cpu", "data": [{"id": "m"}, {"id": 3}, "n"]}', "0.16.0+cpu", ["m"], id="ok"),
])
def test_the_served_model_and_version_are_read_through_one_loopback_reader(body, version, models):
    """``/version`` and ``/v1/models`` are read the same way (:func:`eagle3ops.window.loopback.read_json`): one
    ``curl -s -f`` GET on the host's loopback at serving's port, no key in argv; no answer, a body that is not JSON
    or not an object is None, and each reader keeps only its well-formed field."""
    from eagle3ops.window.loopback import read_json
    from eagle3ops.window.servedmodel import served_models
    from eagle3ops.window.servedversion import served_version

    r = _Routes({} if body is None else {"/version": body, "/v1/models": body})
    assert served_version(r) == version and served_models(r) == models
    port = r.host.serving.port
    assert r.asked == [["curl", "-s", "-f", "--max-time", "5", f"http://127.0.0.1:{port}/version"],
                       ["curl", "-s", "-f", "--max-time", "5", f"http://127.0.0.1:{port}/v1/models"]]
    assert read_json(r, "/version") == (None if body in (None, "not json") else json.loads(body))


class _Health(_Serving):
    """Answers ``curl -s -o /dev/null -w %{http_code} ... URL`` with ``code`` (exit 127: no curl on the host)."""

    def __init__(self, code: str | None):
        super().__init__(None)
        self.code = code

    def run(self, argv, *, check=True, timeout=None, stdin=None, **_):
        self.asked.append(list(argv))
        res = _Res(self.code or "", ok=self.code is not None)
        res.exited = 0 if self.code is not None else 127
        return res


@pytest.mark.parametrize("code, words, healthy", [
    pytest.param("200", "/health 200", True, id="healthy"),
    pytest.param("503", "/health 503", False, id="unhealthy"),
    pytest.param("000", "/health: no answer", False, id="no-answer"),
    pytest.param(None, "/health not checked (no curl on the host)", None, id="no-curl"),
])
def test_health_is_asked_through_the_same_loopback_reader(code, words, healthy):
    """``status``/``recover``'s ``/health`` goes through :mod:`eagle3ops.window.loopback` too (its status code, no
    key in argv, the same URL shape as the other routes); no curl on the host is "not checked", not unhealthy."""
    from eagle3ops.window.live import probe_health

    r = _Health(code)
    assert probe_health(r) == (words, healthy)
    port = r.host.serving.port
    assert r.asked == [["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5",
                        f"http://127.0.0.1:{port}/health"]]
