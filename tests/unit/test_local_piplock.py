"""The images' pip locks (stateward_local.piplock): reading, writing, checking lock files and
the uv and pip commands built from them."""

from __future__ import annotations

import dataclasses

import pytest

from stateward_local.images import piplock

pytestmark = pytest.mark.unit

A = "a" * 64
B = "b" * 64
C = "c" * 64
BOOKWORM = piplock.Target(suite="bookworm")
INSTANCE = piplock.Target(
    suite="trixie",
    requirements=("patroni[kubernetes,psycopg3]==4.1.5",),
    from_source=("ydiff",),
)
INPUTS = ("kopf>=1.45,<1.46", "PyYAML >= 6.0, <7")

PINS = f"""\
kopf==1.45.2 \\
    --hash=sha256:{A} \\
    --hash=sha256:{B}
    # via -r requirements.in
pyyaml==6.0.4 \\
    --hash=sha256:{C}
    # via
    #   -r requirements.in
    #   kopf
"""


def lock_text(
    target: piplock.Target = BOOKWORM,
    inputs: tuple[str, ...] = INPUTS,
    from_source: tuple[str, ...] = (),
    pins: str = PINS,
) -> str:
    header = piplock.header(title="Test.", target=target, inputs=inputs, from_source=from_source)
    return header + pins


# --------------------------------------------------------------------------------------------
# Suites and targets


def test_each_suite_names_its_python_and_an_x86_64_manylinux_platform() -> None:
    assert dict(piplock.SUITES) == {
        "bookworm": piplock.Suite(python="3.11", platform="x86_64-manylinux_2_36"),
        "trixie": piplock.Suite(python="3.13", platform="x86_64-manylinux_2_40"),
    }
    assert (BOOKWORM.python, BOOKWORM.platform) == ("3.11", "x86_64-manylinux_2_36")
    assert (INSTANCE.python, INSTANCE.platform) == ("3.13", "x86_64-manylinux_2_40")


def test_a_target_names_its_files_by_suite_build_lock_first() -> None:
    assert BOOKWORM.lock_name == "requirements-bookworm.txt"
    assert BOOKWORM.build_lock_name == "build-requirements-bookworm.txt"
    assert BOOKWORM.files == ("build-requirements-bookworm.txt", "requirements-bookworm.txt")
    assert INSTANCE.files == ("build-requirements-trixie.txt", "requirements-trixie.txt")
    assert dataclasses.asdict(INSTANCE) == {
        "suite": "trixie",
        "requirements": ("patroni[kubernetes,psycopg3]==4.1.5",),
        "from_source": ("ydiff",),
    }


@pytest.mark.parametrize("suite", ["sid", "", "Bookworm"])
def test_a_target_for_an_unknown_suite_is_refused(suite: str) -> None:
    with pytest.raises(ValueError, match=rf"no pip lock target for suite '{suite}' \(known:"):
        piplock.Target(suite=suite)


# --------------------------------------------------------------------------------------------
# Names


@pytest.mark.parametrize(
    ("name", "normalized"),
    [
        ("PyYAML", "pyyaml"),
        ("typing_extensions", "typing-extensions"),
        ("zope.interface", "zope-interface"),
        ("a-_.b", "a-b"),
        ("prometheus-client", "prometheus-client"),
    ],
)
def test_names_are_normalized_as_pypi_compares_them(name: str, normalized: str) -> None:
    assert piplock.normalize(name) == normalized


@pytest.mark.parametrize(
    ("requirement", "name"),
    [
        ("patroni[kubernetes,psycopg3]==4.1.5", "patroni"),
        ("PyYAML>=6.0,<7", "pyyaml"),
        ("  python_json_logger >= 3.1", "python-json-logger"),
        ("wheel", "wheel"),
        ("setuptools>=69", "setuptools"),
        ("psycopg[binary]==3.3.9", "psycopg"),
        ("x; python_version < '3.12'", "x"),
    ],
)
def test_a_requirement_names_its_project(requirement: str, name: str) -> None:
    assert piplock.requirement_name(requirement) == name


@pytest.mark.parametrize("requirement", ["", "   ", ">=1.0", "-e .", "[extra]"])
def test_a_string_that_names_no_project_is_refused(requirement: str) -> None:
    with pytest.raises(ValueError, match="not a requirement"):
        piplock.requirement_name(requirement)


# --------------------------------------------------------------------------------------------
# Parsing


def test_a_uv_lock_parses_into_header_fields_and_pins() -> None:
    lock = piplock.parse(lock_text(INSTANCE, from_source=("ydiff",)))
    assert lock.problems == ()
    assert lock.fields == {
        "suite": ("trixie",),
        "python": ("3.13",),
        "platform": ("x86_64-manylinux_2_40",),
        "from-source": ("ydiff",),
        "input": ("kopf>=1.45,<1.46", "PyYAML>=6.0,<7"),
    }
    assert lock.pins == {
        "kopf": piplock.Pin(name="kopf", version="1.45.2", hashes=(A, B)),
        "pyyaml": piplock.Pin(name="pyyaml", version="6.0.4", hashes=(C,)),
    }
    assert lock.field("suite") == "trixie" and lock.field("nothing") is None


def test_a_field_named_twice_has_no_single_value() -> None:
    lock = piplock.parse("# suite: bookworm\n# suite: trixie\n" + PINS)
    assert lock.fields["suite"] == ("bookworm", "trixie")
    assert lock.field("suite") is None


def test_comments_after_the_first_pin_are_not_header_fields() -> None:
    text = f"# suite: bookworm\nkopf==1.45.2 --hash=sha256:{A}\n# python: 3.11\n# via: x\n"
    assert piplock.parse(text).fields == {"suite": ("bookworm",)}


def test_the_headers_prose_adds_no_field() -> None:
    text = piplock.header(title="What: anything.", target=BOOKWORM, inputs=())
    assert set(piplock.parse(text).fields) == {"suite", "python", "platform"}


@pytest.mark.parametrize(
    ("line", "pin"),
    [
        (f"kopf==1.45.2 --hash=sha256:{A}", ("kopf", "1.45.2")),
        (f"kopf == 1.45.2 --hash sha256:{A}", ("kopf", "1.45.2")),
        (f"Kopf===1.45.2 --hash=sha256:{A}", ("kopf", "1.45.2")),
        (f"psycopg[binary]==3.3.9 --hash=sha256:{A}", ("psycopg", "3.3.9")),
        (f"certifi==2026.10.19.post1 --hash=sha256:{A}", ("certifi", "2026.10.19.post1")),
        (f"x==1.0+local --hash=sha256:{A}", ("x", "1.0+local")),
        (f"x==1!2.0rc1 --hash=sha256:{A}", ("x", "1!2.0rc1")),
        (f'x==1.0 ; python_version < "3.12" --hash=sha256:{A}', ("x", "1.0")),
        (f"x==1.0 --hash=sha256:{A}  # a comment", ("x", "1.0")),
        (f"x==1.0 \\\n  --hash=sha256:{A} \\\n", ("x", "1.0")),  # a continuation at the end
        (f"x==1.0 \\\r\n    --hash=sha256:{A}\r\n", ("x", "1.0")),
    ],
)
def test_pinned_lines_in_the_forms_pip_reads(line: str, pin: tuple[str, str]) -> None:
    lock = piplock.parse(line)
    assert lock.problems == ()
    [(name, found)] = lock.pins.items()
    assert (found.name, found.version, found.hashes) == (*pin, (A,))
    assert name == pin[0]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (f"kopf>=1.45 --hash=sha256:{A}", "'kopf>=1.45' is not a package pinned to one version"),
        (f"kopf==1.* --hash=sha256:{A}", "'kopf==1.*' is not a package pinned to one version"),
        ("kopf", "'kopf' is not a package pinned to one version"),
        (f"kopf @ https://x/kopf.whl --hash=sha256:{A}", "is not a package pinned"),
        ("--index-url https://mirror.invalid/simple", "is not a package pinned"),
        ("-e .", "'-e .' is not a package pinned"),
        ("-r other.txt", "is not a package pinned"),
        ("kopf==1.45.2", "kopf has no --hash"),
        ("kopf==1.45.2 --hash=md5:0123456789abcdef0123456789abcdef", "a hash that is not a sha256"),
        ("kopf==1.45.2 --hash=sha256:abc", "kopf has a hash that is not a sha256: sha256:abc"),
        (f"kopf==1.45.2 --hash=sha256:{A.upper()}", "a hash that is not a sha256"),
        (f"kopf==1.45.2 --hash={A}", "a hash that is not a sha256"),
    ],
)
def test_lines_that_are_not_hash_pins_are_problems(line: str, problem: str) -> None:
    lock = piplock.parse(f"# suite: bookworm\n\n{line}\n")
    [found] = lock.problems
    assert found.startswith("line 3: ") and problem in found, found


def test_a_package_locked_twice_under_any_spelling_is_a_problem() -> None:
    text = f"PyYAML==6.0.4 --hash=sha256:{A}\npyyaml==6.0.3 --hash=sha256:{B}\n"
    lock = piplock.parse(text)
    assert lock.problems == ("line 2: pyyaml is locked twice",)
    assert lock.pins["pyyaml"].version == "6.0.4", "the first one counts"


def test_lines_are_numbered_from_where_a_continued_line_starts() -> None:
    text = f"a==1 \\\n  --hash=sha256:{A}\n\n# via x\nb>=2 \\\n  --hash=sha256:{B}\n"
    assert piplock.parse(text).problems == (
        "line 5: 'b>=2' is not a package pinned to one version (name==version)",
    )


def test_an_empty_file_has_nothing() -> None:
    assert piplock.parse("") == piplock.Lock(fields={}, pins={}, problems=())


# --------------------------------------------------------------------------------------------
# The header and the check


def test_the_header_records_the_target_and_its_inputs() -> None:
    header = piplock.header(
        title="What the x image's venv takes from PyPI.",
        target=INSTANCE,
        inputs=("kopf >= 1.45, < 1.46", "patroni[kubernetes,psycopg3]==4.1.5"),
        from_source=("YDiff",),
    )
    lines = header.splitlines()
    assert lines[0] == "# What the x image's venv takes from PyPI."
    assert "make lock" in header and "--require-hashes" in header
    assert lines[-6:] == [
        "# suite: trixie",
        "# python: 3.13",
        "# platform: x86_64-manylinux_2_40",
        "# from-source: ydiff",
        "# input: kopf>=1.45,<1.46",
        "# input: patroni[kubernetes,psycopg3]==4.1.5",
    ]
    assert header.endswith("\n") and all(line.startswith("# ") for line in lines)
    assert all(len(line) <= 100 for line in lines[1:])


def test_a_current_lock_has_no_problem() -> None:
    assert piplock.check(lock_text(), target=BOOKWORM, inputs=INPUTS) == []
    shuffled = ("PyYAML>=6.0,<7", " kopf >=1.45, <1.46 ")
    assert piplock.check(lock_text(), target=BOOKWORM, inputs=shuffled) == [], (
        "order and spaces aside"
    )
    text = lock_text(
        INSTANCE, from_source=("ydiff",), pins=PINS + f"ydiff==1.4.2 --hash=sha256:{A}\n"
    )
    assert piplock.check(text, target=INSTANCE, inputs=INPUTS, from_source=("YDiff",)) == []


def test_a_lock_made_from_other_inputs_says_what_changed() -> None:
    inputs = ("kopf>=1.46", "PyYAML>=6.0,<7", "httpx")
    problems = piplock.check(lock_text(), target=BOOKWORM, inputs=inputs)
    assert problems == [
        "made from other inputs (+httpx, +kopf>=1.46, -kopf>=1.45,<1.46)",
        "does not lock httpx",
    ]


def test_a_lock_for_another_suite_is_refused_field_by_field() -> None:
    problems = piplock.check(lock_text(BOOKWORM), target=INSTANCE, inputs=INPUTS)
    assert problems[:3] == [
        "made for suite bookworm, not trixie",
        "made for python 3.11, not 3.13",
        "made for platform x86_64-manylinux_2_36, not x86_64-manylinux_2_40",
    ]


def test_a_lock_without_a_header_is_refused() -> None:
    assert piplock.check(PINS, target=BOOKWORM, inputs=INPUTS) == [
        "made for suite None, not bookworm",
        "made for python None, not 3.11",
        "made for platform None, not x86_64-manylinux_2_36",
        "made from other inputs (+PyYAML>=6.0,<7, +kopf>=1.45,<1.46)",
    ]


def test_packages_from_source_must_match_and_be_locked() -> None:
    problems = piplock.check(
        lock_text(INSTANCE, from_source=("ydiff",)),
        target=INSTANCE,
        inputs=INPUTS,
        from_source=("ydiff",),
    )
    assert problems == ["does not lock ydiff"]
    problems = piplock.check(
        lock_text(INSTANCE, from_source=("ydiff",)), target=INSTANCE, inputs=INPUTS
    )
    assert problems == ["made with other packages from source (-ydiff)"]
    problems = piplock.check(
        lock_text(INSTANCE), target=INSTANCE, inputs=INPUTS, from_source=("ydiff",)
    )
    assert problems == [
        "made with other packages from source (+ydiff)",
        "does not lock ydiff",
    ]


def test_an_input_the_lock_lacks_and_an_empty_lock_are_problems() -> None:
    only_kopf = f"kopf==1.45.2 --hash=sha256:{A}\n"
    assert piplock.check(lock_text(pins=only_kopf), target=BOOKWORM, inputs=INPUTS) == [
        "does not lock pyyaml"
    ]
    assert piplock.check(lock_text(pins=""), target=BOOKWORM, inputs=INPUTS) == [
        "locks no package",
        "does not lock kopf",
        "does not lock pyyaml",
    ]


def test_line_problems_come_first() -> None:
    broken = PINS + "httpx>=0.27\n"
    problems = piplock.check(lock_text(pins=broken), target=BOOKWORM, inputs=INPUTS)
    assert len(problems) == 1 and problems[0].endswith(
        "'httpx>=0.27' is not a package pinned to one version (name==version)"
    )


# --------------------------------------------------------------------------------------------
# Commands


def test_the_uv_command_resolves_for_the_targets_python_and_platform_wheels_only() -> None:
    argv = piplock.compile_command(
        ["uv"], target=BOOKWORM, source="requirements.in", output="requirements-bookworm.txt"
    )
    assert argv == [
        "uv", "pip", "compile", "--quiet", "--generate-hashes", "--no-header",
        "--python-version", "3.11", "--python-platform", "x86_64-manylinux_2_36",
        "--only-binary", ":all:",
        "--output-file", "requirements-bookworm.txt", "requirements.in",
    ]  # fmt: skip


def test_the_uv_command_with_packages_from_source_and_upgrade() -> None:
    argv = piplock.compile_command(
        ["/venv/bin/python", "-m", "uv"],
        target=INSTANCE,
        source="in.txt",
        output="out.txt",
        from_source=("ydiff", "other"),
        upgrade=True,
    )
    assert argv == [
        "/venv/bin/python", "-m", "uv", "pip", "compile", "--quiet", "--generate-hashes",
        "--no-header", "--python-version", "3.13", "--python-platform", "x86_64-manylinux_2_40",
        "--only-binary", ":all:", "--no-binary", "ydiff", "--no-binary", "other", "--upgrade",
        "--output-file", "out.txt", "in.txt",
    ]  # fmt: skip


PIP = ["/v/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check"]


def test_the_install_commands_for_wheels_only() -> None:
    commands = piplock.install_commands(
        BOOKWORM, pip="/v/bin/pip", folder="/b", project="/b/stateward", options=["--cert", "/ca"]
    )
    assert commands == [
        (
            [*PIP, "--require-hashes", "--no-deps", "--only-binary", ":all:", "--cert", "/ca",
             "-r", "/b/build-requirements-bookworm.txt"],
            "pip install --require-hashes --no-deps -r build-requirements-bookworm.txt",
        ),
        (
            [*PIP, "--require-hashes", "--no-deps", "--only-binary", ":all:", "--cert", "/ca",
             "-r", "/b/requirements-bookworm.txt"],
            "pip install --require-hashes --no-deps -r requirements-bookworm.txt",
        ),
        (
            [*PIP, "--no-index", "--no-deps", "--no-build-isolation", "/b/stateward"],
            "pip install --no-deps stateward",
        ),
        (["/v/bin/pip", "check"], "pip check"),
    ]  # fmt: skip


def test_the_install_commands_build_packages_from_source_with_the_locked_tools() -> None:
    [build, lock, project, check] = piplock.install_commands(
        INSTANCE, pip="/v/bin/pip", folder="/b", project="/b/s"
    )
    assert build[0] == [
        *PIP, "--require-hashes", "--no-deps", "--only-binary", ":all:",
        "-r", "/b/build-requirements-trixie.txt",
    ]  # fmt: skip
    assert lock[0] == [
        *PIP, "--require-hashes", "--no-deps", "--only-binary", ":all:", "--no-binary", "ydiff",
        "--no-build-isolation", "--use-pep517", "-r", "/b/requirements-trixie.txt",
    ]  # fmt: skip
    assert project[0][-4:] == ["--no-index", "--no-deps", "--no-build-isolation", "/b/s"]
    assert check == (["/v/bin/pip", "check"], "pip check")


def test_every_command_that_reaches_pypi_checks_hashes() -> None:
    for target in (BOOKWORM, INSTANCE):
        for argv, _ in piplock.install_commands(target, pip="p", folder="/b", project="/s"):
            if argv[1] == "install":
                assert "--require-hashes" in argv or "--no-index" in argv, argv
                # A lock is the whole closure: pip resolves nothing beyond it.
                assert "--no-deps" in argv, argv
                assert "--only-binary" in argv or "--no-index" in argv, argv


def test_pip_reads_the_binary_options_as_meant() -> None:
    """pip itself: ``--only-binary :all:`` before ``--no-binary ydiff`` leaves ydiff to its
    source and everything else to wheels (the other order would drop the exception)."""
    install = pytest.importorskip("pip._internal.commands.install")
    [_, (argv, _), *_] = piplock.install_commands(INSTANCE, pip="p", folder="/b", project="/s")
    options, _ = install.InstallCommand("install", "").parse_args(argv[2:])
    assert options.require_hashes is True
    assert options.format_control.get_allowed_formats("ydiff") == frozenset({"source"})
    assert options.format_control.get_allowed_formats("patroni") == frozenset({"binary"})
    assert options.build_isolation is False and options.requirements == [
        "/b/requirements-trixie.txt"
    ]
    reversed_order = ["--no-binary", "ydiff", "--only-binary", ":all:"]
    options, _ = install.InstallCommand("install", "").parse_args(reversed_order)
    assert options.format_control.get_allowed_formats("ydiff") == frozenset({"binary"})
