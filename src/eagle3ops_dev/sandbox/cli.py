"""``python -m eagle3ops_dev sandbox up|down|status``: the embedded sandbox host from the command line."""

from __future__ import annotations

import typer

from eagle3ops_dev.sandbox.host import SandboxError, down, status, up

app = typer.Typer(no_args_is_help=True, help="The embedded sandbox host: sshd on 127.0.0.1 + its own dockerd.")


@app.command("up")
def up_command(
    name: str = typer.Option("sandbox", envvar="EAGLE3OPS_SANDBOX",
                             help="Sandbox name (deploy/hosts.yaml's `sandbox` entry uses $EAGLE3OPS_SANDBOX too)."),
    ssh_port: int = typer.Option(2222, envvar="EAGLE3OPS_SANDBOX_SSH_PORT", help="sshd port on 127.0.0.1."),
) -> None:
    """Start (or re-verify) the sandbox host; idempotent."""
    try:
        inf = up(name, ssh_port)
    except SandboxError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1)
    what = f"started {', '.join(inf.started)}" if inf.started else "already running, verified"
    typer.echo(f"sandbox {name}: {what}; ssh {inf.user}@127.0.0.1:{inf.ssh_port}, docker {inf.docker_version} "
               f"at {inf.docker_host}")
    typer.echo(f"  identity_file {inf.identity_file}\n  known_hosts   {inf.known_hosts}")


@app.command("down")
def down_command(
    name: str = typer.Option("sandbox", envvar="EAGLE3OPS_SANDBOX", help="Sandbox name."),
    purge: bool = typer.Option(False, help="Also delete its images, data, keys and client files."),
) -> None:
    """Stop the sandbox host's sshd and dockerd."""
    stopped = down(name, purge=purge)
    typer.echo(f"sandbox {name}: stopped {', '.join(stopped) or 'nothing (was not running)'}"
               + ("; state purged" if purge else ""))


@app.command("status")
def status_command(
    name: str = typer.Option("sandbox", envvar="EAGLE3OPS_SANDBOX", help="Sandbox name."),
    ssh_port: int = typer.Option(2222, envvar="EAGLE3OPS_SANDBOX_SSH_PORT", help="sshd port on 127.0.0.1."),
) -> None:
    """Show whether the sandbox's daemons run; exit 1 when not healthy."""
    st = status(name, ssh_port)
    for k, v in st.items():
        typer.echo(f"{k:15} {v}")
    if not (st["dockerd"] and st["docker_version"] and st["sshd"] and st["ssh_listening"]):
        raise typer.Exit(1)
