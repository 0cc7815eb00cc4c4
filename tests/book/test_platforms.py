"""The learner's set-up on every system the pages name, resolved by uv against the index.

``scripts/platforms.py`` resolves ``requirements-learner.txt`` (and, for Exercise 7,
``requirements-triton.lock``) for each learner platform and CPython release, all at once,
with uv's resolver: the markers and wheel tags of that system, wheels only. Here each
resolution is checked against an independent reading of the file: its lines whose PEP 508
marker holds on that system (evaluated by ``packaging`` with the marker values written
below), which must be exactly what uv installs there, but for the CUDA libraries that only
PyPI's Linux torch brings. A pin that breaks a platform fails here (two mutants of the file
show it). Needs the package index; without it the module skips with one line, never passes.
The CPU-only torch build comes from PyTorch's own index, resolved when it is reachable;
offline, the course's venv (the page's CPU build) shows that its torch accepts the lock's
Triton.
"""

import importlib.metadata
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
from packaging.requirements import Requirement

from scripts import environment, platforms
from tests.book.pins import pins_where, requirement_lines

ROOT = environment.ROOT
# PEP 508 marker values of each platform, written out here (not taken from the code under test)
MARKERS = {
    "x86_64-manylinux_2_28": {"sys_platform": "linux", "platform_system": "Linux",
                              "os_name": "posix", "platform_machine": "x86_64"},
    "aarch64-manylinux_2_28": {"sys_platform": "linux", "platform_system": "Linux",
                               "os_name": "posix", "platform_machine": "aarch64"},
    "aarch64-apple-darwin": {"sys_platform": "darwin", "platform_system": "Darwin",
                             "os_name": "posix", "platform_machine": "arm64"},
    "x86_64-pc-windows-msvc": {"sys_platform": "win32", "platform_system": "Windows",
                               "os_name": "nt", "platform_machine": "AMD64"},
}
LEARNER_SYSTEMS = [(p.uv, python) for p, python in platforms.learner_systems()]
TRITON_SYSTEMS = [(p.uv, python) for p, python in platforms.triton_systems()]


def marker_environment(platform, python):
    major, minor, _ = python.split(".")
    return {**MARKERS[platform], "python_version": f"{major}.{minor}",
            "python_full_version": python, "implementation_name": "cpython",
            "implementation_version": python, "platform_python_implementation": "CPython",
            "platform_release": "", "platform_version": "", "extra": ""}


def expected_pins(platform, python, files):
    """``{name: version}`` of the lines of ``files`` whose marker holds on that system."""
    pins = {}
    for name in files:
        pins.update(pins_where((ROOT / name).read_text(),
                                           marker_environment(platform, python)))
    return pins


@pytest.fixture(scope="module")
def index():
    reason = platforms.index_unreachable()
    if reason:
        pytest.skip(f"{reason}: the platform check resolves against it")


@pytest.fixture(scope="module")
def matrices(index):
    """The learner matrix and Exercise 7's, resolved at once (uv waits on the index)."""
    with ThreadPoolExecutor(2) as pool:
        learner = pool.submit(platforms.resolve_all, platforms.learner_systems())
        triton = pool.submit(platforms.resolve_all, platforms.triton_systems(),
                             platforms.TRITON_FILES)
        return learner.result(), triton.result()


@pytest.fixture(scope="module")
def learner_matrix(matrices):
    return matrices[0]


@pytest.fixture(scope="module")
def triton_matrix(matrices):
    return matrices[1]


# -- offline: what the matrix is made of ------------------------------------------------------
def test_matrix_covers_every_platform_and_both_sides_of_each_python_bound():
    assert set(MARKERS) == {p.uv for p in environment.LEARNER_PLATFORMS}
    releases = platforms.python_releases()
    assert releases == ["3.11.0", "3.11.4", "3.11.5", "3.12.0", "3.13.0"]
    assert len(LEARNER_SYSTEMS) == 4 * 5
    assert {(p, v) for p, v in TRITON_SYSTEMS if p in MARKERS} == {
        *((p.uv, f"{m}.0") for p in environment.TRITON_PLATFORMS
          for m in environment.LEARNER_PYTHONS),
        ("aarch64-apple-darwin", "3.11.0"), ("x86_64-pc-windows-msvc", "3.11.0")}


def test_each_learner_pin_is_one_line_with_the_opposite_line_for_a_locked_package():
    text = (ROOT / "requirements-learner.txt").read_text()
    lines = requirement_lines(text)
    lock = environment.lock_pins(environment.LOCKS[:1])
    for pin in environment.LEARNER_PINS:
        mine = [(version, marker) for name, version, marker in lines if name == pin.name]
        if pin.name in lock:
            assert mine == [(lock[pin.name], environment.opposite(pin.marker)),
                            (pin.version, pin.marker)]
        else:
            assert mine == [(pin.version, pin.marker)]
    # every other line is the lock's, with no marker
    others = [(n, v, m) for n, v, m in lines if n not in {p.name for p in environment.LEARNER_PINS}]
    assert others and all(m is None and lock[n] == v for n, v, m in others)
    assert environment.opposite('python_full_version < "3.11.5"') == \
        'python_full_version >= "3.11.5"'
    with pytest.raises(ValueError, match="one comparison"):
        environment.opposite('os_name == "nt" and sys_platform == "win32"')


def test_parse_compiled_and_what_only_torch_brings():
    text = "\n".join([
        "numpy==2.4.6              # via -r requirements-learner.txt, contourpy",
        "torch==2.13.0             # via -r requirements-learner.txt",
        "nvidia-a==1.0             # via torch",
        "nvidia-b==2.0             # via nvidia-a, torch",
        "shared==3.0               # via nvidia-a, numpy",
        "loop-a==1.0               # via loop-b, torch",
        "loop-b==1.0               # via loop-a",
    ])
    versions, via = platforms.parse_compiled(text)
    assert versions["nvidia-b"] == "2.0" and via["numpy"] == {"-r requirements-learner.txt",
                                                              "contourpy"}
    resolution = platforms.Resolution(environment.LEARNER_PLATFORMS[0], "3.12.0",
                                      platforms.LEARNER_FILES, versions=versions, via=via)
    assert resolution.torch_only() == ["loop-a", "loop-b", "nvidia-a", "nvidia-b"]
    problems = resolution.problems(lock={"numpy": "2.4.6", "torch": "2.13.0", "triton": "1"})
    assert len(problems) == 1 and problems[0].startswith("shared==3.0 (for numpy, nvidia-a)")


def test_cpu_build_in_the_course_venv_accepts_the_triton_lock():
    """The course's venv holds the torch build the page installs on Linux (``+cpu`` on the
    course machines) and requirements-triton.lock: torch's requirements accept that Triton."""
    triton = environment.lock_pins(environment.LOCKS[1:])["triton"]
    torch_build = importlib.metadata.version("torch")
    assert torch_build.split("+")[0] == environment.grading_versions()["torch"]
    try:   # `make test` installs the Triton lock on top of requirements.lock
        assert importlib.metadata.version("triton") == triton
    except importlib.metadata.PackageNotFoundError:
        pass
    for text in importlib.metadata.requires("torch") or []:
        requirement = Requirement(text)
        if environment.canonical(requirement.name) == "triton" and (
                requirement.marker is None or requirement.marker.evaluate({"extra": ""})):
            assert triton in requirement.specifier, (torch_build, text)


# -- the matrix (the package index; ``slow``: about 30 s, out of `make test-fast`) ---------------
@pytest.mark.slow
@pytest.mark.parametrize("platform,python", LEARNER_SYSTEMS)
def test_learner_requirements_install_with_their_versions(learner_matrix, platform, python):
    resolution = learner_matrix[(platform, python)]
    assert not resolution.problems(), f"{platform} Python {python}: {resolution.problems()}"
    expected = expected_pins(platform, python, platforms.LEARNER_FILES)
    got = {name: platforms.public(version) for name, version in resolution.versions.items()
           if not resolution.from_torch_only(name)}
    assert got == expected
    # what torch alone brings is the CUDA build's, on Linux only; the notebooks' packages
    # are the grader's everywhere
    assert not resolution.torch_only() or MARKERS[platform]["sys_platform"] == "linux"
    assert all(name.startswith(("nvidia-", "cuda-")) or name == "triton"
               for name in resolution.torch_only())
    grading = environment.grading_versions()
    assert got["numpy"] == grading["numpy"] and got["torch"] == grading["torch"]


@pytest.mark.slow
@pytest.mark.parametrize("platform,python", TRITON_SYSTEMS)
def test_exercise_7_installs_with_the_default_torch_where_triton_has_wheels(triton_matrix,
                                                                           platform, python):
    resolution = triton_matrix[(platform, python)]
    assert not platforms.triton_problems(resolution), platforms.triton_problems(resolution)
    if platform in {p.uv for p in environment.TRITON_PLATFORMS}:
        assert resolution.versions["triton"] == environment.grading_versions()["triton"]
        assert "-r requirements-triton.lock" in resolution.via["triton"]
        assert "torch" in resolution.via["triton"]  # the very Triton PyPI's torch requires
    else:
        assert "triton" in resolution.error and "no wheels" in resolution.error


@pytest.mark.slow
def test_exercise_7_installs_with_the_cpu_build(index):
    """PyTorch's CPU-only build beside requirements-triton.lock, from PyTorch's index."""
    reason = platforms.index_unreachable(environment.TORCH_CPU_INDEX.rstrip("/") + "/torch/")
    if reason:
        pytest.skip(f"{reason}: the CPU build's resolution needs it "
                    "(offline, see test_cpu_build_in_the_course_venv_accepts_the_triton_lock)")
    results = platforms.resolve_all(platforms.triton_systems(environment.TRITON_PLATFORMS),
                                    platforms.TRITON_FILES,
                                    sources=platforms.cpu_build_sources())
    for (platform, python), resolution in results.items():
        assert not platforms.triton_problems(resolution), (platform, python,
                                                           platforms.triton_problems(resolution))
        if platform.startswith("x86_64"):
            assert resolution.versions["torch"].endswith("+cpu") and not resolution.torch_only()


# -- a pin that breaks a platform fails the check ---------------------------------------------
def mutant(tmp_path, edit):
    text = (ROOT / "requirements-learner.txt").read_text()
    (tmp_path / "requirements-learner.txt").write_text(edit(text))
    shutil.copy(ROOT / "requirements-triton.lock", tmp_path)
    return tmp_path


@pytest.mark.slow
def test_a_pin_that_breaks_a_python_or_a_platform_fails(index, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    # the lock's soupsieve for every Python: no solution on 3.11.4
    no_marker = mutant(first, lambda text: "\n".join(
        line.split(" ;")[0] if line.startswith("soupsieve==") else line
        for line in text.splitlines() if not line.startswith("soupsieve==2.10")))
    # Windows' colorama left out: uv takes a version that no line names
    no_colorama = mutant(second, lambda text: "\n".join(
        line for line in text.splitlines() if not line.startswith("colorama==")))
    linux, windows = environment.LEARNER_PLATFORMS[0], environment.LEARNER_PLATFORMS[3]
    with ThreadPoolExecutor(2) as pool:
        broken = pool.submit(platforms.resolve, linux, "3.11.4", root=no_marker)
        unpinned = pool.submit(platforms.resolve, windows, "3.12.0", root=no_colorama)
        broken, unpinned = broken.result(), unpinned.result()
    assert "soupsieve==4.1.3" in broken.error and "3.11.5" in broken.error
    assert broken.problems() == [broken.error]
    (problem,) = unpinned.problems()   # the same system resolves with the file (the matrix)
    assert problem.startswith("colorama==") and "(for ipython)" in problem
