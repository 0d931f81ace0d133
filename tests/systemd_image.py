"""The image of the real-systemd test host (``tests/test_systemd_real.py``), built on the debootstrap minbase with
Debian's systemd, dbus, pam_systemd (systemd-logind sessions for SSH logins), OpenSSH server and procps; built by
``tests/prebuild.py`` so that its cold build (about a minute) never counts against a test's time limit."""

from __future__ import annotations

import subprocess

IMAGE = "eagle3ops-test/systemd-host:bookworm"
DOCKERFILE = """FROM eagle3ops/debian-minbase:bookworm
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      systemd systemd-sysv dbus libpam-systemd openssh-server procps >/dev/null && apt-get clean \\
    && rm -rf /var/lib/apt/lists/*
STOPSIGNAL SIGRTMIN+3
CMD ["/lib/systemd/systemd"]
"""


def build() -> str:
    """Build (docker's layer cache makes a rebuild seconds) and return :data:`IMAGE`.

    Raises:
        subprocess.CalledProcessError: the build failed (its output is in the exception)."""
    subprocess.run(["docker", "build", "--network", "host", "-q", "-t", IMAGE, "-"], input=DOCKERFILE,
                   capture_output=True, text=True, check=True, timeout=900)
    return IMAGE
