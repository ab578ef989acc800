"""A release a user can upgrade to, kept so: the version of pyproject.toml, of ms_accum.__version__, of the READMEs
and of CHANGELOG.md's newest release is one; every deprecated name the package defines is listed under the
changelog's "Deprecated" and warns naming a later release that removes it; train.py --help names only classes and
functions that exist, and the engine cell the driver drives."""
import contextlib
import importlib.util
import inspect
import io
import os
import re
import tomllib
import types

import pytest
from packaging.version import Version

import mindspore
from mindspore import nn

import ms_accum
from ms_accum.core.deprecation import REMOVED_IN, RENAMED_ARGUMENTS, renamed
from conftest import ROOT, ZOO

CHANGELOG = os.path.join(ROOT, "CHANGELOG.md")
RELEASE = re.compile(r"^## \[?(\d+\.\d+\.\d+)\]? - (\d{4}-\d{2}-\d{2})$", re.M)  # '## [0.4.0] - 2026-12-02'
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")  # Keep a Changelog's, in its order
README_VERSION = {"README.md": r"version (\d+\.\d+\.\d+)", "README_CN.md": r"当前版本 (\d+\.\d+\.\d+)"}
# Words of the help that look like class names but name products, models or a number, not Python objects
# AdaScale: a method (Johnson et al.), not a class
NOT_CLASSES = {"MindSpore", "MindCV", "LeNet5", "ResNet18", "NaN", "AdaScale"}
ROOTS = {"ms_accum": ms_accum, "mindspore": mindspore, "ms": mindspore, "nn": nn}  # how the help names modules


def read(path):
    with open(path, encoding="utf-8") as file:
        return file.read()


def entries(text):
    """[(release or 'Unreleased', section kind, list item as one line)] of a changelog's text."""
    found, release, kind, item = [], None, None, None
    for line in text.splitlines() + [""]:
        if item is not None and line.startswith("  ") and line.strip():
            item += " " + line.strip()
            continue
        if item is not None:
            found.append((release, kind, item))
            item = None
        if line.startswith("## "):
            match = RELEASE.match(line)
            release, kind = (match.group(1) if match else line[3:].strip("[] ")), None
        elif line.startswith("### "):
            kind = line[4:].strip()
        elif line.startswith("- ") and kind is not None:
            item = line[2:]
    return found


def deprecated_names(classes):
    """[(class, old name, its renamed descriptor)] of every renamed descriptor the classes define or inherit."""
    return [(cls, name, inspect.getattr_static(cls, name)) for cls in classes for name in dir(cls)
            if isinstance(inspect.getattr_static(cls, name), renamed)]


PUBLIC_CLASSES = [getattr(ms_accum, name) for name in ms_accum.__all__ if inspect.isclass(getattr(ms_accum, name))]
DEPRECATED = deprecated_names(PUBLIC_CLASSES)


def test_one_version_in_pyproject_the_package_the_readmes_and_the_changelog():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as file:
        version = tomllib.load(file)["project"]["version"]
    assert ms_accum.__version__ == version, f"ms_accum.__version__ {ms_accum.__version__} != pyproject's {version}"
    text = read(CHANGELOG)
    released = RELEASE.findall(text)
    assert released, "CHANGELOG.md has no release heading such as '## [0.4.0] - 2026-12-02'"
    assert released[0][0] == version, f"CHANGELOG.md's newest release is {released[0][0]}, the package is {version}"
    assert text.index("## [Unreleased]") < text.index(f"## [{version}]"), "'## [Unreleased]' must come first"
    versions = [Version(number) for number, _ in released]
    assert versions == sorted(set(versions), reverse=True), f"releases not newest first, or repeated: {versions}"
    dates = [date for _, date in released]
    assert dates == sorted(dates, reverse=True), f"release dates not newest first: {dates}"
    for readme, pattern in README_VERSION.items():
        named = re.findall(pattern, read(os.path.join(ROOT, readme)))
        assert named == [version], f"{readme} names version {named}, the package is {version}"
        assert "](CHANGELOG.md)" in read(os.path.join(ROOT, readme)), f"{readme} must link CHANGELOG.md"


def test_each_release_lists_keep_a_changelog_sections_in_their_order():
    text = read(CHANGELOG)
    for release in re.split(r"^## ", text, flags=re.M)[1:]:
        kinds = re.findall(r"^### (.*)$", release, re.M)
        assert all(kind in KINDS for kind in kinds), f"{release.splitlines()[0]}: sections {kinds}, not of {KINDS}"
        assert kinds == sorted(kinds, key=KINDS.index), f"{release.splitlines()[0]}: sections out of order: {kinds}"


def test_deprecated_names_are_found_on_a_class_and_its_subclasses():
    """The finder behind the parametrized test below sees a renamed descriptor, also inherited."""
    base = type("Base", (), {"old": renamed("old", "new"), "kept": property(lambda self: 1)})
    child = type("Child", (base,), {})
    assert [(cls.__name__, name) for cls, name, _ in deprecated_names([base, child])] == [("Base", "old"),
                                                                                          ("Child", "old")]


def stand_in(cls, dotted, value):
    """An object of a class named as `cls` whose attribute path `dotted` (such as 'cell.drop') holds `value`."""
    *parents, last = dotted.split(".")
    leaf = types.SimpleNamespace(**{last: value})
    for name in reversed(parents):
        leaf = types.SimpleNamespace(**{name: leaf})
    owner = type(cls.__name__, (), {})()
    owner.__dict__.update(vars(leaf))
    return owner


@pytest.mark.parametrize("cls, old, descriptor", DEPRECATED,
                         ids=[f"{cls.__name__}.{old}" for cls, old, _ in DEPRECATED])
def test_a_deprecated_name_warns_of_the_later_release_that_removes_it_and_is_in_the_changelog(cls, old, descriptor):
    removed_in = descriptor.removed_in
    assert Version(removed_in) > Version(ms_accum.__version__), \
        f"{cls.__name__}.{old} was to be removed in {removed_in}, but this is {ms_accum.__version__}: remove it"
    value = object()
    with pytest.warns(DeprecationWarning) as caught:
        got = descriptor.__get__(stand_in(cls, descriptor.new, value))
    # a name whose call did what the new one's does not gives the new value with the old call (OldCall)
    assert (got if descriptor.call is None else got.target) is value, f"{old} does not read {descriptor.new}"
    message = str(caught[0].message)
    for part in (f"For '{cls.__name__}', '{old}'", f"'{descriptor.new}'", f"ms_accum {removed_in}."):
        assert part in message, f"{cls.__name__}.{old}'s warning lacks {part!r}: {message}"
    assert f"ms_accum {removed_in}" in descriptor.__doc__, descriptor.__doc__
    listed = [item for _, kind, item in entries(read(CHANGELOG)) if kind == "Deprecated"
              and (f"`{cls.__name__}.{old}`" in item or f"`{old}`" in item and f"`{cls.__name__}`" in item)]
    assert listed, f"CHANGELOG.md lists no Deprecated entry naming `{old}` of `{cls.__name__}`"
    assert any(f"ms_accum {removed_in}" in item for item in listed), \
        f"CHANGELOG.md's Deprecated entry of {cls.__name__}.{old} does not say 'ms_accum {removed_in}' removes it"


@pytest.mark.parametrize("owner, old, new", RENAMED_ARGUMENTS)
def test_a_renamed_argument_is_accepted_and_in_the_changelog(owner, old, new):
    """Each argument deprecated through renamed_argument is still a keyword of its public function, beside the new
    name, and CHANGELOG.md's Deprecated list names it with the release that removes it."""
    parameters = inspect.signature(getattr(ms_accum, owner)).parameters
    assert parameters[old].kind is inspect.Parameter.KEYWORD_ONLY and new in parameters
    listed = [item for _, kind, item in entries(read(CHANGELOG)) if kind == "Deprecated" and f"`{old}`" in item]
    assert listed and any(f"ms_accum {REMOVED_IN}" in item for item in listed), \
        f"CHANGELOG.md's Deprecated list does not name `{old}` of {owner} with 'ms_accum {REMOVED_IN}'"


def test_every_deprecation_warning_of_the_package_goes_through_renamed():
    """A DeprecationWarning raised elsewhere would escape the changelog checks above: deprecate through
    ms_accum.core.deprecation (renamed, renamed_argument), or extend this module to find the new kind."""
    package = os.path.join(ROOT, "ms_accum")
    outside = []
    for directory, _, files in os.walk(package):
        for name in files:
            path = os.path.join(directory, name)
            if name.endswith(".py") and path != os.path.join(package, "core", "deprecation.py") and \
                    re.search(r"\b(Deprecation|PendingDeprecation|Future)Warning\b", read(path)):
                outside.append(os.path.relpath(path, ROOT))
    assert not outside, f"deprecations outside core/deprecation.py: {outside}"


@pytest.fixture(scope="module")
def train_help():
    """What `python model_zoo_lenet/train.py --help` prints, unwrapped (no line breaks inside a help string)."""
    spec = importlib.util.spec_from_file_location("lenet_train_for_help", os.path.join(ZOO, "train.py"))
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", "10000")
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed), pytest.raises(SystemExit):
            train.parse_args(["--help"])
    return printed.getvalue()


def resolves(dotted):
    """Whether 'ms_accum.Accumulator', 'mindspore.nn.TrainOneStepCell' or 'nn.Momentum' names an object."""
    obj = ROOTS[dotted.split(".")[0]]
    for name in dotted.split(".")[1:]:
        if not hasattr(obj, name):
            return False
        obj = getattr(obj, name)
    return True


def test_train_py_help_names_only_classes_and_functions_that_exist(train_help):
    assert "--gradient_accumulation_steps" in train_help and "'driver'" in train_help, train_help[:500]
    dotted = {name for name in re.findall(r"\b(?:ms_accum|mindspore|ms|nn)(?:\.\w+)+", train_help)}
    missing = sorted(name for name in dotted if not resolves(name))
    assert not missing, f"train.py --help names what does not exist: {missing}"
    bare = set(re.findall(r"(?<![\w.])([A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+|[A-Z][a-z]\w*_[A-Z]+)\b", train_help))
    unknown = sorted(bare - set(ms_accum.__all__) - NOT_CLASSES)
    assert not unknown, f"train.py --help names classes that ms_accum does not have: {unknown} (qualify " \
                        f"MindSpore's as mindspore.nn.X; add a product's name to NOT_CLASSES)"


def test_train_py_help_names_the_engine_cell_the_driver_drives(train_help):
    net = nn.Dense(2, 1)
    driven = type(ms_accum.GradientAccumulation(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1)).cell)
    start = train_help.index("Trainers: 'driver'")
    driver = train_help[start:train_help.index("'model_accu'", start)]
    assert driven.__name__ in driver, f"train.py --help says of the driver {driver!r}, but it drives a " \
                                      f"{driven.__name__}"


def test_no_python_line_is_over_120_characters():
    """The house style (shared with the docs' code blocks): every line of the package, the benchmarks, the model
    zoo, the scripts' Python and the tests within 120 characters."""
    long_lines = []
    for folder in ("ms_accum", "benchmarks", "model_zoo_lenet", "scripts", "tests"):
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(base, name)
                    with open(path, encoding="utf-8") as f:
                        long_lines += [f"{os.path.relpath(path, ROOT)}:{number} ({len(line.rstrip())})"
                                       for number, line in enumerate(f, 1) if len(line.rstrip()) > 120]
    assert not long_lines, f"lines over 120 characters: {long_lines}"
