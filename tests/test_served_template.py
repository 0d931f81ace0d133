"""Training data rendered with the chat template serving uses (SpecForge #296).

Serving may run with ``--chat-template FILE`` (or the template inline); prepare rendered with the tokenizer's own
template anyway. Now ``prepare.chat_template: auto`` (the default) is resolved by the extract window before the stop
to what the live server uses — its ``--chat-template`` read on the host (the file's text through the serving
container, :mod:`eagle3ops.window.served_template`), else the tokenizer's own — the prepare manifest records the
template's sha256 and source (in-image: ``tests/image/test_stages.py``), and ``speculate`` refuses a run whose data
was rendered with another template than the live release's unless ``--allow-template-mismatch``.

Real parts: the build engine's Docker daemon runs the container whose flags and file are read (the local executor,
as over SSH); the speculate driver with the fake host of ``tests/test_speculate_ship.py``."""

from __future__ import annotations

import hashlib
import json
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml

from eagle3ops.config import load_inventory
from eagle3ops.config.inventory import HostConfig
from eagle3ops.executor import Local
from eagle3ops.speculate import onhost
from eagle3ops.window import served_template as stpl
from test_speculate_ship import _FakeRemote, _Res

REPO = Path(__file__).resolve().parents[1]
TEMPLATE = "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<<assistant>>{% endif %}"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("argv, value", [
    (["vllm", "serve", "/model", "--chat-template", "/t/chat.jinja", "--port", "8000"], "/t/chat.jinja"),
    (["python3", "-m", "vllm.entrypoints.openai.api_server", "--chat-template=/t/x.jinja"], "/t/x.jinja"),
    (["vllm", "serve", "/model", "--port", "8000"], None),
    (["vllm", "serve", "/model", "--chat-template", TEMPLATE], TEMPLATE),
])
def test_the_chat_template_flag_is_read_from_the_servers_argv(argv, value):
    assert stpl.chat_template_flag(argv) == value


def test_auto_resolves_to_what_serving_uses_and_an_explicit_setting_stays():
    text = "target_model: /model\nprepare:\n  max_seq_len: 512\n"
    served = stpl.ServedTemplate(value="/t/chat.jinja", text=TEMPLATE, origin="container 'vllm': --chat-template "
                                 "/t/chat.jinja")
    out = yaml.safe_load(stpl.resolve_config(text, served))
    assert out["prepare"]["chat_template"] == {"file": stpl.SERVED_FILE, "sha256": _sha(TEMPLATE),
                                               "origin": served.origin}
    assert out["prepare"]["max_seq_len"] == 512 and out["target_model"] == "/model"
    assert yaml.safe_load(stpl.resolve_config(text, None))["prepare"]["chat_template"] == "tokenizer"
    mine = "prepare:\n  chat_template: tokenizer\n"
    assert stpl.resolve_config(mine, served) == mine  # the user chose: left as written
    from eagle3ops.config.pipeline import PipelineConfig

    a = PipelineConfig.model_validate(yaml.safe_load(stpl.resolve_config(text, None)))
    b = PipelineConfig.model_validate(yaml.safe_load(text))
    c = PipelineConfig.model_validate(yaml.safe_load(stpl.resolve_config(text, served)))
    # the tokenizer's own template (auto with no flag): the same prepare inputs as before the key existed
    assert a.section_digest("prepare") == b.section_digest("prepare") != c.section_digest("prepare")


class LocalHost(Local):
    def __init__(self, host: HostConfig):
        super().__init__()
        self.host = host


@pytest.fixture
def template_container():
    """A container on the build engine whose command carries ``--chat-template /srv/chat.jinja`` (a shell that
    sleeps, the flag among its arguments, as a server's would be) and holds that file."""
    name = f"e3-tpl-{uuid.uuid4().hex[:6]}"
    image = "eagle3ops/debian-minbase:bookworm"
    script = f"printf '%s' \"$0\" > /srv/chat.jinja && sleep 300"
    subprocess.run(["docker", "run", "-d", "--name", name, "--network", "host", "--entrypoint", "sh", image, "-c",
                    script.replace("$0", "$1"), "x", TEMPLATE, "--chat-template", "/srv/chat.jinja"],
                   check=True, capture_output=True, timeout=60)
    try:
        yield name
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=60)


@pytest.mark.images
def test_a_serving_containers_template_is_read_on_the_host(template_container, tmp_path):
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox").model_copy(update={
        "docker_host": "unix:///var/run/docker.sock"})
    h = h.model_copy(update={"serving": h.serving.model_copy(update={"container": template_container})})
    served = stpl.read_served_template(LocalHost(h))
    assert served is not None and served.value == "/srv/chat.jinja" and served.text == TEMPLATE, served
    assert served.sha256 == _sha(TEMPLATE) and template_container in served.origin


def _remote(prepare_sha: str, tokenizer_sha: str) -> _FakeRemote:
    h = load_inventory(REPO / "deploy/hosts.yaml").host("sandbox")
    r = _FakeRemote(h, [7])
    orig = r.run

    def run(argv, **kw):
        res = orig(argv, **kw)
        if argv[-1] == "inspect":
            ans = onhost.parse_answer(res.stdout)
            ans["prepare_template"] = {"chat_template_sha256": prepare_sha, "chat_template_source": "tokenizer"}
            ans["tokenizer_template_sha256"] = tokenizer_sha
            res = _Res(onhost.MARK + json.dumps(ans))
        return res

    r.run = run
    return r


def test_speculate_refuses_data_rendered_with_another_template_than_the_live_release(monkeypatch):
    from eagle3ops.speculate import ship
    from eagle3ops.window import run as window_run

    windows: list[str] = []
    monkeypatch.setattr(window_run, "run_window", lambda r_, *, kind, **kw: windows.append(kind) or {
        "window_id": "w", "outcome": "ok", "speculate": {"verdict": "rollback", "reason": "why",
                                                        "attempt_dir": "x", "live_release": 7}})
    # the live release serves with the tokenizer's own template (no --chat-template: the fake host has no
    # container to read), the run's data was rendered with another one
    r = _remote(prepare_sha="aa" * 32, tokenizer_sha="bb" * 32)
    with pytest.raises(ship.SpeculateError) as e:
        ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p"), echo=lambda *_: None)
    msg = str(e.value)
    assert "aa" * 8 in msg and "bb" * 8 in msg and "--allow-template-mismatch" in msg and "chat template" in msg, msg
    assert not windows
    ship.speculate(r, ship.SpeculateOptions(run="r1", pipeline_image="p", allow_template_mismatch=True),
                   echo=lambda *_: None)
    assert windows == ["speculate"]
    same = _remote(prepare_sha="bb" * 32, tokenizer_sha="bb" * 32)
    ship.speculate(same, ship.SpeculateOptions(run="r1", pipeline_image="p"), echo=lambda *_: None)
    assert windows == ["speculate", "speculate"]


@pytest.mark.parametrize("flag,prepare,expect", [
    (["--chat-template", "/models/tool-chat.jinja"], "", "serving's --chat-template /models/tool-chat.jinja"),
    ([], "", "the tokenizer's own"),
    (["--chat-template", "/models/tool-chat.jinja"], "  chat_template: tokenizer\n",
     "the tokenizer's own (pipeline prepare.chat_template: tokenizer)"),
])
def test_offline_dry_run_names_the_chat_template_prepare_will_use(flag, prepare, expect):
    """``extract --dry-run --offline`` cannot read the live server, so it says which chat template prepare will use
    and where that comes from: ``prepare.chat_template`` when it names one, else (``auto``) the inventory's serving
    flags, labelled as assumed (online, the live server's command line is read before serving stops)."""
    from eagle3ops.window.offline import offline_dry_run

    inv = load_inventory(REPO / "deploy/hosts.yaml")
    h = inv.host("sandbox")
    h = h.model_copy(update={"serving": h.serving.model_copy(update={"args": [*h.serving.args, *flag]})})
    text = "target_model: /model\nprepare:\n  datasets: [builtin:sharegpt]\n" + prepare
    lines: list[str] = []
    res = offline_dry_run(h, kind="extract", run="r1", pipeline_text=text, command="t", echo=lines.append)
    facts = dict(res["assumed"])
    assert expect in facts.get("chat template", ""), facts
    if not prepare:
        assert "hosts.sandbox.serving.args" in facts["chat template"], facts
    assert any(ln.startswith("#   assumed chat template: ") for ln in lines), lines
