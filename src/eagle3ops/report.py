"""The run report: one HTML page (jinja2) with PNG plots (matplotlib) of a run's measured results.

``eagle3ops report HOST --run RUN`` reads, over SSH and read-only, what the host recorded for the run — each
window's ``plan.json``/``journal.jsonl``/``result.json`` under ``<state_dir>/windows/``, the train stage's
``metrics.jsonl`` and ``manifest.json``, the speculation gate's ``speculate/result.json`` under
``<data_dir>/runs/<run>/`` — and renders locally:

- ``timeline.png``: each window's steps (stop, stages, restore, health...) on one time axis, serving downtime shaded;
- ``train.png``: training loss and per-position full accuracy (``full_acc_k``) per step;
- ``acceptance.png``: acceptance rate per draft position, measured on the host beside the offline estimate;
- ``throughput.png``: output tokens/s against concurrency, baseline and speculative releases;
- ``calibration.png``: across every run of the host that went through ``speculate`` (in the audit log's
  order), the mean acceptance length three ways: the train stage's offline estimate, the gate's measured figure
  (``speculate/result.json``) and production's, pooled by ``eagle3ops watch`` (``speculate/production.json``);
- ``index.html``: the tables and the plots.

:func:`render` returns the exact series it plotted (read back from the matplotlib artists), so a test can check
the picture against the source JSON.
"""

from __future__ import annotations

import json
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable

from eagle3ops import redact

__all__ = ["calibration_rows", "collect", "collect_training", "cycle_train_host", "plan_run", "render"]


def _json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a torn last line of a file still being written
    return out


def plan_run(plan: dict[str, Any]) -> str | None:
    """The run a window's plan belongs to: its ``run`` field, else the ``--run-dir .../runs/<run>`` of its stages
    (a container's ``command``, a venv stage process's ``argv``; release and rollback windows belong to no run unless
    their plan names one)."""
    if plan.get("run"):
        return str(plan["run"])
    for st in plan.get("stages") or []:
        spec = st.get("spec") or {}
        cmd = list(spec.get("command") or spec.get("argv") or [])
        if "--run-dir" in cmd and cmd.index("--run-dir") + 1 < len(cmd):
            return Path(cmd[cmd.index("--run-dir") + 1]).name
    return None


def _cat(r: Any) -> Callable[[str], str]:
    from eagle3ops.commands import host as hc

    return lambda path: r.run(hc.cat_if_exists(path), check=False).stdout


def collect_training(r: Any, host: Any, run: str) -> dict[str, Any]:
    """The train stage's ``metrics.jsonl`` and ``manifest.json`` of ``run`` on ``host`` through ``r``; read-only.
    Returns ``{"train_metrics": [...], "train_manifest": {...} | None}``."""
    cat, rdir = _cat(r), f"{host.data_dir}/runs/{run}"
    manifest = cat(f"{rdir}/train/manifest.json")
    return {"train_metrics": _json_lines(cat(f"{rdir}/train/metrics.jsonl")),
            "train_manifest": json.loads(manifest) if manifest.strip() else None}


def cycle_train_host(journal: list[dict[str, Any]]) -> str | None:
    """The host that trained a cycle's head: the first host of the last ``start`` of its ``train`` step that was
    followed by ``done`` in the cycle's journal on production (``<state_dir>/cycles/<run>/journal.jsonl``, as
    :class:`eagle3ops.speculate.cyclerun.CycleJournal` writes it; the same reading as its ``finished_hosts``, which
    this module may not import); None when no train step finished."""
    started: list[str] = []
    done: str | None = None
    for e in journal:
        if e.get("step") != "train":
            continue
        if e.get("event") == "start":
            started, done = list(e.get("hosts") or []), None
        elif e.get("event") == "done":
            done = started[0] if started else None
    return done


def collect(r: Any, host: Any, run: str,
            remote_for: Callable[[str], AbstractContextManager[Any]] | None = None) -> dict[str, Any]:
    """Read what ``host`` recorded for ``run`` through ``r`` (an :class:`eagle3ops.remote.Remote`); read-only.

    A run of ``eagle3ops cycle`` keeps its parts elsewhere, and they are read there: the gate's result of the head
    from the work host is in the attempt folder its newest ``speculate`` audit entry of the run names (the run's
    ``speculate/result.json`` is only its own head's), and the training is on the work host that the cycle's
    journal says trained it, read through ``remote_for(name)`` (a context manager giving that host's remote and
    its config as ``.host``; None: not read).

    Returns:
        ``{"host", "run", "windows": [{"plan", "result", "journal"}...] (in start order), "train_metrics": [...],
        "train_manifest": {...} | None, "speculate": {...} | None, "train_host": name | None (the cycle's work host
        that trained, when the training is not on ``host``), "calibration": [...]}``.
    """
    from eagle3ops.commands import host as hc

    cat = _cat(r)

    wdir = f"{host.state_dir}/windows"
    windows = []
    for wid in sorted(r.run(hc.ls(wdir), check=False).stdout.split()):
        try:
            plan = json.loads(cat(f"{wdir}/{wid}/plan.json") or "{}")
        except ValueError:
            continue
        if plan_run(plan) != run:
            continue
        result = cat(f"{wdir}/{wid}/result.json")
        windows.append({"plan": plan, "result": json.loads(result) if result.strip() else None,
                        "journal": _json_lines(cat(f"{wdir}/{wid}/journal.jsonl"))})
    rdir = f"{host.data_dir}/runs/{run}"
    audit = _json_lines(cat(f"{host.state_dir}/audit.jsonl"))
    spec = cat(f"{rdir}/speculate/result.json")
    if not spec.strip():  # a head from elsewhere (a cycle's): its newest attempt on this run
        tried = [e for e in audit if e.get("kind") == "speculate" and e.get("run") == run and e.get("attempt_dir")]
        spec = cat(f"{tried[-1]['attempt_dir']}/result.json") if tried else ""
    training, train_host = collect_training(r, host, run), None
    if not training["train_metrics"] and training["train_manifest"] is None:
        train_host = cycle_train_host(_json_lines(cat(f"{host.state_dir}/cycles/{run}/journal.jsonl")))
        if train_host is not None and train_host != host.name and remote_for is not None:
            with remote_for(train_host) as wr:
                training = collect_training(wr, wr.host, run)
    # the plans hold the stages' and the change's environment as given: masked here, so no page or plot shows it
    return redact.value({"host": host.name, "run": run, "windows": windows, **training,
                         "speculate": json.loads(spec) if spec.strip() else None, "train_host": train_host,
                         "calibration": calibration_rows(audit, cat, f"{host.data_dir}/runs")}, host.secret_env)


def calibration_rows(audit: list[dict[str, Any]], read: Any, runs_dir: str) -> list[dict[str, Any]]:
    """One row per head shipped through ``speculate`` (a run and its head, or a head from elsewhere on that run), in
    the order of its latest ``kind: speculate`` audit entry: ``{"run", "label", "t", "verdict", "offline", "gate",
    "production", "production_intervals"}`` (mean acceptance lengths; None where not recorded). ``label`` is
    ``RUN:HEAD8`` (the first 8 hex digits of the head's sha256) when the entry names the head. The figures come
    from the entry's attempt folder (``result.json``; ``production.json``, written there by ``watch``); entries
    older than attempt folders: ``<runs_dir>/<run>/speculate/``. ``read(path)`` returns a host file's text ("" when
    missing)."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for e in audit:
        if e.get("kind") == "speculate" and e.get("run"):
            key = (e["run"], e.get("head_sha256") or "")
            latest.pop(key, None)
            latest[key] = e
    rows = []
    for (run, sha), e in latest.items():
        where = e.get("attempt_dir") or f"{runs_dir}/{run}/speculate"

        def load(name: str, folder: str) -> dict[str, Any]:
            text = read(f"{folder}/{name}")
            try:
                return json.loads(text) if text.strip() else {}
            except ValueError:
                return {}

        res = load("result.json", where)
        prod, offline = load("production.json", where), res.get("offline_estimate")
        if isinstance(offline, dict):  # {"acceptance_length", "per_position", ...}
            offline = offline.get("acceptance_length")
        rows.append({"run": run, "label": f"{run}:{sha[:8]}" if sha else run, "t": e.get("t", ""),
                     "verdict": res.get("verdict", e.get("verdict")), "offline": offline,
                     "gate": (res.get("spec_decode") or {}).get("mean_acceptance_length"),
                     "production": prod.get("mean_acceptance_length"),
                     "production_intervals": prod.get("intervals")})
    return rows


def _window_label(plan: dict[str, Any]) -> str:
    """``prepare+extract``, ``vocab+train``, or the plan's kind (release, rollback)."""
    names = [st.get("name") for st in plan.get("stages") or [] if st.get("name")]
    return "+".join(names) if names else str(plan.get("kind", "?"))


def _steps(journal: list[dict[str, Any]]) -> list[tuple[str, float, float, str]]:
    """(step, start epoch s, end epoch s, outcome) of each journal step that started and ended."""
    open_: dict[str, float] = {}
    out = []
    for ev in journal:
        step, event, t = ev.get("step"), ev.get("event"), ev.get("epoch")
        if step is None or t is None:
            continue
        if event == "start":
            open_[step] = float(t)
        elif event in ("ok", "error", "failed") and step in open_:
            out.append((step, open_.pop(step), float(t), event))
    return out


def _save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_timeline(plt: Any, windows: list[dict[str, Any]], out_dir: Path) -> list[tuple[str, str, float, float]]:
    """``timeline.png``: each window's journaled steps on one row (shaded: serving down, from the stop's start
    until the health gate passed); returns ``[(window_id, step, start_s, end_s)]``, seconds from the run's first
    event."""
    t0 = min((ev["epoch"] for w in windows for ev in w["journal"] if "epoch" in ev), default=0.0)
    fig, ax = plt.subplots(figsize=(10, 1.4 + 0.5 * max(1, len(windows))))
    tab = plt.get_cmap("tab10").colors
    palette = iter([tab[i] for i in (0, 1, 4, 5, 6, 8, 9)])  # not the red/greens/grey of stop/restore/record
    colors: dict[str, Any] = {"stop": "#d62728", "restore": "#2ca02c", "health": "#98df8a", "record": "#7f7f7f"}
    labelled: set[str] = set()
    timeline = []
    for i, w in enumerate(windows):
        wid = w["plan"].get("window_id", "?")
        steps = _steps(w["journal"])
        stop = next((s for s in steps if s[0] == "stop"), None)
        health = [s for s in steps if s[0] == "health" and s[3] == "ok"]
        if stop and health:  # serving down from the stop's start until the health gate passed
            ax.barh(i, health[-1][2] - stop[1], left=stop[1] - t0, height=0.8, color="#fdd", zorder=0)
        for name, a, b, outcome in steps:
            if name not in colors:
                colors[name] = next(palette, "#1f77b4")
            ax.barh(i, b - a, left=a - t0, height=0.5, color=colors[name],
                    edgecolor="black" if outcome != "ok" else None, label=None if name in labelled else name)
            labelled.add(name)
            timeline.append((wid, name, round(a - t0, 3), round(b - t0, 3)))
    ax.set_yticks(range(len(windows)), [_window_label(w["plan"]) for w in windows])
    if labelled:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_xlabel("seconds since the run's first window step (shaded: serving down)")
    ax.set_title("maintenance windows")
    _save(plt, fig, out_dir / "timeline.png")
    return timeline


def _plot_training(plt: Any, metrics: list[dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """``train.png``: the loss and each draft position's full accuracy per step; returns ``{"loss" |
    "full_acc_<k>": [(step, value)]}``."""
    plotted: dict[str, Any] = {}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    if metrics:
        steps = [m["step"] for m in metrics]
        (line,) = ax1.plot(steps, [m["loss"] for m in metrics], marker=".")
        plotted["loss"] = list(zip(line.get_xdata().tolist(), line.get_ydata().tolist()))
        for k in sorted({key for m in metrics for key in m if key.startswith("full_acc_")}):
            (line,) = ax2.plot(steps, [m.get(k) for m in metrics], marker=".", label=k)
            plotted[k] = list(zip(line.get_xdata().tolist(), line.get_ydata().tolist()))
        ax2.legend(fontsize=8)
    ax1.set(title="training loss", xlabel="step")
    ax2.set(title="full accuracy per draft position", xlabel="step", ylim=(0, 1))
    _save(plt, fig, out_dir / "train.png")
    return plotted


def _plot_acceptance(plt: Any, spec: dict[str, Any] | None, offline: dict[str, Any] | None,
                     out_dir: Path) -> dict[str, Any]:
    """``acceptance.png``: the acceptance rate per draft position, measured on the host beside the offline
    estimate; returns ``{"acceptance_measured" | "acceptance_offline": {position: rate}}`` for the sides present."""
    plotted: dict[str, Any] = {}
    measured = {int(k): float(v) for k, v in
                ((spec or {}).get("spec_decode", {}).get("acceptance_per_position") or {}).items()}
    offline_pos = {int(k): float(v) for k, v in ((offline or {}).get("per_position") or {}).items()}
    fig, ax = plt.subplots(figsize=(6, 3.5))
    width = 0.4
    if measured:
        bars = ax.bar([p - width / 2 for p in sorted(measured)], [measured[p] for p in sorted(measured)], width,
                      label="measured on the host")
        plotted["acceptance_measured"] = {p: b.get_height() for p, b in zip(sorted(measured), bars)}
    if offline_pos:
        bars = ax.bar([p + width / 2 for p in sorted(offline_pos)], [offline_pos[p] for p in sorted(offline_pos)],
                      width, label="offline estimate (optimistic)")
        plotted["acceptance_offline"] = {p: b.get_height() for p, b in zip(sorted(offline_pos), bars)}
    ax.set(title="acceptance rate per draft position", xlabel="position", ylim=(0, 1))
    if measured or offline_pos:
        ax.legend(fontsize=8)
    _save(plt, fig, out_dir / "acceptance.png")
    return plotted


def _plot_throughput(plt: Any, spec: dict[str, Any] | None, out_dir: Path) -> dict[str, list[tuple[float, float]]]:
    """``throughput.png``: output tokens/s against concurrency, baseline and speculative; returns
    ``{"baseline" | "speculative": [(concurrency, tokens/s)]}``."""
    levels = (spec or {}).get("levels") or {}
    fig, ax = plt.subplots(figsize=(6, 3.5))
    thr: dict[str, list[tuple[float, float]]] = {}
    for side in ("baseline", "speculative"):
        pts = sorted((int(c), float(lv[side]["output_tokens_per_s"])) for c, lv in levels.items())
        if pts:
            (line,) = ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=side)
            thr[side] = list(zip(line.get_xdata().tolist(), line.get_ydata().tolist()))
    ax.set(title="output tokens/s against concurrency", xlabel="concurrent requests", ylabel="tokens/s")
    if thr:
        ax.legend(fontsize=8)
    _save(plt, fig, out_dir / "throughput.png")
    return thr


def _plot_calibration(plt: Any, cal: list[dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """``calibration.png``: the mean acceptance length per head shipped, offline estimate, gate and production
    (:func:`calibration_rows`); returns ``{"offline" | "gate" | "production": [(label, value)]}``."""
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cal)), 3.5))
    plotted: dict[str, Any] = {}
    for key, label, marker in (("offline", "offline estimate (train)", "s"), ("gate", "speculation gate", "o"),
                               ("production", "production (watch)", "^")):
        pts = [(i, float(row[key])) for i, row in enumerate(cal) if row.get(key) is not None]
        if pts:
            (line,) = ax.plot([i for i, _ in pts], [v for _, v in pts], marker=marker, label=label)
            plotted[key] = [(cal[int(i)]["label"], v) for i, v in
                            zip(line.get_xdata().tolist(), line.get_ydata().tolist())]
    ax.set_xticks(range(len(cal)), [row["label"] for row in cal], rotation=30, ha="right")
    ax.set(title="mean acceptance length per head shipped", xlabel="run:head digest", ylabel="tokens per target step")
    if plotted:
        ax.legend(fontsize=8)
    _save(plt, fig, out_dir / "calibration.png")
    return plotted


def _write_page(data: dict[str, Any], out_dir: Path) -> None:
    """``index.html`` from ``templates/report.html.j2``: the windows' outcomes, the training and the decision."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    from eagle3ops import __version__

    env = Environment(loader=PackageLoader("eagle3ops", "templates"), autoescape=select_autoescape())
    rows = []
    for w in data.get("windows") or []:
        res = w.get("result") or {}
        rows.append({"window_id": w["plan"].get("window_id"), "kind": _window_label(w["plan"]),
                     "outcome": res.get("outcome", "running or lost"), "downtime_s": res.get("downtime_s"),
                     "wall_s": res.get("wall_s"), "stage_seconds": res.get("stage_seconds") or {},
                     "release": res.get("release"), "warnings": res.get("warnings") or []})
    metrics = data.get("train_metrics") or []
    manifest = data.get("train_manifest") or {}
    html = env.get_template("report.html.j2").render(
        run=data.get("run"), host=data.get("host"), generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        version=__version__, windows=rows, train_steps=len(metrics),
        final_loss=metrics[-1]["loss"] if metrics else None, train_manifest=manifest,
        offline=manifest.get("offline_estimate") or None, decision=data.get("speculate") or None,
        calibration=data.get("calibration") or [])
    (out_dir / "index.html").write_text(html)


def render(data: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Write ``index.html`` and the PNG plots for ``data`` (what :func:`collect` returns) into ``out_dir``.

    Returns:
        the plotted series: ``timeline`` [(window_id, step, start_s, end_s)] (seconds from the run's first event),
        ``loss`` and ``full_acc_<k>`` [(step, value)], ``acceptance_measured`` / ``acceptance_offline``
        {position: rate}, ``throughput`` {"baseline"|"speculative": [(concurrency, tokens/s)]}, ``calibration``
        {"offline"|"gate"|"production": [(label, value)]}.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    spec = data.get("speculate") or None
    offline = (data.get("train_manifest") or {}).get("offline_estimate") or None
    plotted: dict[str, Any] = {"timeline": _plot_timeline(plt, data.get("windows") or [], out_dir)}
    plotted.update(_plot_training(plt, data.get("train_metrics") or [], out_dir))
    plotted.update(_plot_acceptance(plt, spec, offline, out_dir))
    plotted["throughput"] = _plot_throughput(plt, spec, out_dir)
    plotted["calibration"] = _plot_calibration(plt, data.get("calibration") or [], out_dir)
    _write_page(data, out_dir)
    return plotted
