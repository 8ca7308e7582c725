"""The image the Dockerfile builds, made without a Docker engine: its COPY lines copied from
the build context (less what .dockerignore excludes) into an empty directory standing for
its WORKDIR, and its `pip install` lines run there in a fresh virtualenv of the same Python.
Its `apt-get install`s cannot be reproduced without a root filesystem of its own: the Debian
packages they name must be installed on this machine (the image test fails naming any that
is not), and the image's processes use them from here.

Everything is read from the Dockerfile, so a directory it forgets to copy is missing here too.
The one substitution: `--index-url` (the PyTorch CPU index, out of reach on this machine) is
dropped, so the same pinned `torch==` comes from this machine's own wheel through pip's
ordinary configuration."""

from __future__ import annotations

import fcntl
import hashlib
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]  # the build context
IMAGE_CACHE = Path.home() / ".cache" / "mebp"
SUBSTITUTED_OPTIONS = {"--index-url"}  # each with its value
# the commands around an `apt-get install` that only fetch or drop the package lists
APT_HOUSEKEEPING = (["apt-get", "update"], ["rm", "-rf", "/var/lib/apt/lists/*"])
INSTALL_GUARD_S = 1800  # a hang guard on the first build (torch and the service's libraries)


@dataclass(frozen=True)
class Copy:
    sources: list[str]  # relative to the build context
    destination: str  # relative to the WORKDIR unless absolute


@dataclass
class Dockerfile:
    base: str = ""
    workdir: PurePosixPath = PurePosixPath("/")
    copies: list[Copy] = field(default_factory=list)
    installs: list[list[str]] = field(default_factory=list)  # each RUN's `pip install` args
    debian_packages: list[str] = field(default_factory=list)  # what its `apt-get install`s name
    env: dict[str, str] = field(default_factory=dict)


def instructions(text: str) -> Iterator[tuple[str, str]]:
    """(INSTRUCTION, its arguments) per instruction, continuation lines joined."""
    logical = ""
    for line in text.splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        keyword, _, arguments = (logical + line).strip().partition(" ")
        logical = ""
        yield keyword.upper(), arguments.strip()


def read_dockerfile(path: Path) -> Dockerfile:
    """The instructions this harness reproduces; any other is an error naming it, so a
    Dockerfile that grows one fails the image test until the harness learns it."""
    image = Dockerfile()
    for keyword, arguments in instructions(path.read_text()):
        words = shlex.split(arguments)
        if keyword == "FROM":
            image.base = words[0]
        elif keyword == "WORKDIR":
            image.workdir = image.workdir / words[0]
        elif keyword == "RUN":
            for command in shell_commands(words):
                if command[:2] == ["pip", "install"]:
                    image.installs.append(command[2:])
                elif command[:2] == ["apt-get", "install"]:
                    image.debian_packages += apt_packages(command[2:], path)
                elif command not in APT_HOUSEKEEPING:
                    raise ValueError(f"{path.name}: RUN {arguments!r}: {shlex.join(command)!r} "
                                     "is not a `pip install` or an `apt-get install`, which "
                                     "is all tests/app/image_harness.py reproduces")
        elif keyword == "COPY":
            if any(word.startswith("--") for word in words) or \
                    any(set(word) & set("*?[") for word in words):
                raise ValueError(f"{path.name}: COPY {arguments!r}: flags and wildcards "
                                 "are not reproduced by tests/app/image_harness.py")
            image.copies.append(Copy(words[:-1], words[-1]))
        elif keyword == "ENV":
            image.env.update(word.split("=", 1) for word in words)
        elif keyword not in ("EXPOSE", "CMD"):  # the test runs the compose file's commands
            raise ValueError(f"{path.name}: {keyword} is not reproduced by "
                             "tests/app/image_harness.py")
    return image


SHELL_OPERATORS = {"||", ";", "|", "&", ">", ">>", "<"}


def shell_commands(words: list[str]) -> list[list[str]]:
    """A RUN's commands, split at its `&&`s (any other shell operator is not reproduced)."""
    commands = [[]]
    for word in words:
        if word in SHELL_OPERATORS:
            raise ValueError(f"RUN {shlex.join(words)!r}: {word!r} is not reproduced by "
                             "tests/app/image_harness.py (only commands joined by &&)")
        if word == "&&":
            commands.append([])
        else:
            commands[-1].append(word)
    return commands


def apt_packages(arguments: list[str], path: Path) -> list[str]:
    """The packages an `apt-get install` names; a version pin is not reproduced."""
    packages, skip = [], False
    for word in arguments:
        if skip:
            skip = False
        elif word in ("-o", "--option", "-t", "--target-release"):
            skip = True  # their value
        elif not word.startswith("-"):
            if "=" in word:
                raise ValueError(f"{path.name}: apt-get install {word!r}: version pins are "
                                 "not reproduced by tests/app/image_harness.py")
            packages.append(word)
    return packages


def missing_debian_packages(packages: list[str]) -> list[str]:
    """Those of ``packages`` dpkg does not have installed on this machine (all of them where
    there is no dpkg)."""
    def installed(package: str) -> bool:
        try:
            status = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package],
                                    capture_output=True, text=True)
        except FileNotFoundError:
            return False
        return status.returncode == 0 and status.stdout.endswith(" installed")
    return [package for package in packages if not installed(package)]


def ignore_patterns(path: Path) -> list[re.Pattern]:
    """.dockerignore's patterns as regular expressions over context-relative paths."""
    patterns = []
    for line in path.read_text().splitlines() if path.exists() else []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise ValueError(f"{path.name}: exceptions ({line}) are not reproduced")
        regex = re.escape(line.strip("/")).replace(r"\*\*/", "(.*/)?") \
            .replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        patterns.append(re.compile(regex))
    return patterns


def copy_context(image: Dockerfile, context: Path, root: Path) -> None:
    """What the COPY lines copy, into ``root`` standing for the image's filesystem; an
    excluded path (or one under an excluded directory) is not copied, as Docker does."""
    excluded = ignore_patterns(context / ".dockerignore")

    def ignored(directory: str, names: list[str]) -> set[str]:
        relative = Path(directory).relative_to(context)
        return {name for name in names
                if any(p.fullmatch((relative / name).as_posix().removeprefix("./"))
                       for p in excluded)}
    for copy in image.copies:
        destination = root / (image.workdir / copy.destination).relative_to("/")
        into_directory = copy.destination.endswith("/") or len(copy.sources) > 1
        for source in copy.sources:
            origin = context / source
            if origin.is_dir():  # Docker copies a directory's contents, not the directory
                shutil.copytree(origin, destination, ignore=ignored, dirs_exist_ok=True)
            else:
                target = destination / origin.name if into_directory else destination
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, target)


def install_arguments(arguments: list[str]) -> list[str]:
    """A RUN's `pip install` arguments less the substituted options and their values."""
    kept, skip = [], False
    for word in arguments:
        if skip:
            skip = False
        elif word in SUBSTITUTED_OPTIONS:
            skip = True
        elif word.split("=", 1)[0] not in SUBSTITUTED_OPTIONS:
            kept.append(word)
    return kept


@dataclass(frozen=True)
class Image:
    root: Path  # stands for the image's /
    dockerfile: Dockerfile

    @property
    def workdir(self) -> Path:
        return self.root / self.dockerfile.workdir.relative_to("/")

    @property
    def bin(self) -> Path:
        return self.root.parent / "venv" / "bin"


def image_digest(context: Path) -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "Dockerfile", ".dockerignore"):
        path = context / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b""))
    return digest.hexdigest()[:16]


@contextmanager
def built_image(context: Path = ROOT, cache: Path = IMAGE_CACHE) -> Iterator[Image]:
    """The image, held for the caller alone (a lock beside it). Its virtualenv is built
    once per digest of pyproject.toml, Dockerfile and .dockerignore and kept in ``cache``
    (`image-<digest>/venv`); its WORKDIR is emptied and copied afresh from ``context`` every
    time, so the sources that run are today's. The editable install points at that WORKDIR."""
    dockerfile = read_dockerfile(context / "Dockerfile")
    base = f"python:{sys.version_info.major}.{sys.version_info.minor}"
    assert dockerfile.base.startswith(base), \
        f"the Dockerfile's {dockerfile.base} is not this machine's {base}"
    missing = missing_debian_packages(dockerfile.debian_packages)
    assert not missing, f"the Dockerfile installs Debian's {missing}, which this machine " \
        "lacks: `make test` installs what the engines need"
    home = cache / f"image-{image_digest(context)}"
    home.mkdir(parents=True, exist_ok=True)
    with open(home.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        image = Image(home / "root", dockerfile)
        shutil.rmtree(image.root, ignore_errors=True)
        copy_context(dockerfile, context, image.root)
        if not (home / "built").exists():
            _install(image, home)
        yield image


def _install(image: Image, home: Path) -> None:
    shutil.rmtree(home / "venv", ignore_errors=True)
    # the base interpreter, not this test's virtualenv: nothing installed here leaks in
    subprocess.run([sys._base_executable, "-m", "venv", str(home / "venv")], check=True)
    for arguments in image.dockerfile.installs:
        subprocess.run([str(image.bin / "pip"), "install", *install_arguments(arguments)],
                       cwd=image.workdir, check=True, timeout=INSTALL_GUARD_S)
    (home / "built").touch()
