"""Certificates for the local secured broker, made with the JDK's ``keytool``.

One directory holds a private certificate authority and, for each identity (the broker and
each mTLS client), a PKCS#12 keystore with its key, its certificate (``CN=<name>``, valid for
``127.0.0.1`` and ``localhost``, for server and client authentication) signed by that
authority, and the authority's certificate. ``ca.pem`` is the authority's certificate for
clients (librdkafka's ``ssl.ca.location``), ``truststore.p12`` the broker's trust store. Every
store has one random password, kept in ``secrets.json`` (mode 0600) beside them. Nothing
here is ever committed: the directory lives under the broker's data directory.

Every ``keytool`` step runs in one JVM (a small Java program that calls keytool's entry point
once per step, reading the steps from a file), since a JVM per step costs seconds each on a
busy machine. Passwords travel in that file (mode 0600, removed afterwards), never on a
command line.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bridge.errors import BrokerStartError, InvalidArgumentError

logger = logging.getLogger(__name__)

CA_NAME = "bridge-local-ca"
"""The certificate authority's common name."""
VALIDITY_DAYS = 3650
"""How long every certificate is valid, days."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

_RUNNER = """\
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

public class BridgeKeytoolSteps {
    public static void main(String[] args) throws Exception {
        for (String line : Files.readAllLines(Path.of(args[0]), StandardCharsets.UTF_8)) {
            if (line.isEmpty()) {
                continue;
            }
            String[] step = line.split("\\t");
            System.out.println("step " + step[0] + " " + step[2]);
            sun.security.tools.keytool.Main.main(step);
        }
    }
}
"""


def check_identity_name(name: str) -> str:
    """``name`` if it can be a certificate's common name and a principal here (letters,
    digits, ``.``, ``_``, ``-``; at most 64 characters), else :class:`InvalidArgumentError`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidArgumentError(
            f"identity name {name!r} must be 1-64 letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where the certificates of one directory are."""

    directory: Path

    @property
    def ca_pem(self) -> Path:
        """The authority's certificate, PEM (clients' ``ssl.ca.location``)."""
        return self.directory / "ca.pem"

    @property
    def truststore(self) -> Path:
        """The broker's trust store (PKCS#12, the authority's certificate)."""
        return self.directory / "truststore.p12"

    def keystore(self, name: str) -> Path:
        """The PKCS#12 keystore of identity ``name`` (key, certificate, authority)."""
        return self.directory / f"{check_identity_name(name)}.p12"

    @property
    def password(self) -> str:
        """The password of every store in the directory."""
        data = json.loads((self.directory / "secrets.json").read_text())
        return str(data["store_password"])

    def __repr__(self) -> str:
        return f"TlsFiles({str(self.directory)!r})"


def ensure_certificates(
    directory: Path, names: tuple[str, ...], java: str, timeout_s: float = 120.0
) -> TlsFiles:
    """Make the authority (once) and a keystore for each identity in ``names`` that has
    none yet, in ``directory``; return where they are. ``java`` is the JDK's ``java``.
    Raises :class:`BrokerStartError` if keytool fails (its output names the step)."""
    files = TlsFiles(Path(directory))
    files.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(files.directory, 0o700)
    secrets_file = files.directory / "secrets.json"
    if not secrets_file.is_file():
        fd = os.open(secrets_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"store_password": secrets.token_urlsafe(24)}, out)
    password = files.password
    ca_store = files.directory / "ca.p12"
    store = ["-storetype", "PKCS12", "-storepass", password]
    steps: list[list[str]] = []
    if not ca_store.is_file():
        for stale in (files.ca_pem, files.truststore):
            stale.unlink(missing_ok=True)
        steps += [
            ["-genkeypair", "-alias", "ca", "-dname", f"CN={CA_NAME}", "-keyalg", "EC",
             "-groupname", "secp256r1", "-validity", str(VALIDITY_DAYS), "-ext", "bc:c",
             "-keystore", str(ca_store), *store, "-keypass", password],
            ["-exportcert", "-alias", "ca", "-rfc", "-file", str(files.ca_pem),
             "-keystore", str(ca_store), *store],
            ["-importcert", "-alias", "ca", "-noprompt", "-file", str(files.ca_pem),
             "-keystore", str(files.truststore), *store],
        ]  # fmt: skip
    made = []
    for name in dict.fromkeys(names):
        keystore = files.keystore(name)
        if keystore.is_file():
            continue
        made.append(name)
        csr, crt = files.directory / f"{name}.csr", files.directory / f"{name}.crt"
        steps += [
            ["-genkeypair", "-alias", name, "-dname", f"CN={name}", "-keyalg", "EC",
             "-groupname", "secp256r1", "-validity", str(VALIDITY_DAYS),
             "-keystore", str(keystore), *store, "-keypass", password],
            ["-certreq", "-alias", name, "-file", str(csr), "-keystore", str(keystore), *store],
            ["-gencert", "-alias", "ca", "-infile", str(csr), "-outfile", str(crt), "-rfc",
             "-validity", str(VALIDITY_DAYS), "-ext", "SAN=IP:127.0.0.1,DNS:localhost",
             "-ext", "KU=digitalSignature,keyAgreement", "-ext", "EKU=serverAuth,clientAuth",
             "-keystore", str(ca_store), *store],
            ["-importcert", "-alias", "ca", "-noprompt", "-file", str(files.ca_pem),
             "-keystore", str(keystore), *store],
            ["-importcert", "-alias", name, "-noprompt", "-file", str(crt),
             "-keystore", str(keystore), *store],
        ]  # fmt: skip
    if steps:
        _run_steps(files.directory, steps, java, timeout_s)
        for name in made:
            for suffix in (".csr", ".crt"):
                (files.directory / f"{name}{suffix}").unlink(missing_ok=True)
    return files


def _run_steps(directory: Path, steps: list[list[str]], java: str, timeout_s: float) -> None:
    for step in steps:
        if any("\t" in arg or "\n" in arg for arg in step):
            raise InvalidArgumentError(f"keytool step {step[0]} has a tab or newline")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=directory, prefix=".keytool-") as work:
        runner = Path(work) / "BridgeKeytoolSteps.java"
        runner.write_text(_RUNNER)
        plan = Path(work) / "steps"
        fd = os.open(plan, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("".join("\t".join(step) + "\n" for step in steps))
        try:
            done = subprocess.run(
                [java, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
                 "--add-exports", "java.base/sun.security.tools.keytool=ALL-UNNAMED",
                 str(runner), str(plan)],
                capture_output=True, text=True, timeout=timeout_s, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise BrokerStartError(
                f"making certificates in {directory} took over {timeout_s:.0f} s"
            ) from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-2000:]
        raise BrokerStartError(
            f"making certificates in {directory} failed (keytool exit {done.returncode}): {output}"
        )
    logger.info(
        "made %d keytool steps' certificates in %s in %.1f s",
        len(steps),
        directory,
        time.monotonic() - started,
    )
