"""tools/gpu_variants.sh without a GPU (GV_DRY=1): each variant's patches apply and are reversed, the tree comes back,
and a patch that does not apply or a missing patch file stops the call with a message naming it, the tree intact."""
import difflib
import os
import pathlib
import shutil
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "tools" / "gpu_variants.sh"
pytestmark = pytest.mark.skipif(not (shutil.which("bash") and shutil.which("patch") and shutil.which("md5sum")),
                                reason="needs bash, patch and md5sum")

ORIGINAL = {
    "device_src/a.h": "int a = 1;\nint b = 2;\nint c = 3;\n",
    "csrc/c.cpp": "int c;\n",
    "gpuos/x.py": "x = 1\n",
}


def make_tree(root):
    for rel, text in ORIGINAL.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def tree(root):
    return {rel: (root / rel).read_text() for rel in ORIGINAL}


def write_patch(root, name, rel, old, new):
    """A `git diff`-style patch of file `rel` replacing line `old` by `new`."""
    before = ORIGINAL[rel].splitlines(keepends=True)
    after = [new if line == old else line for line in before]
    assert after != before, "the test's patch must change something"
    (root / name).write_text("".join(difflib.unified_diff(before, after, "a/" + rel, "b/" + rel)))
    return name


def run(root, variants):
    env = dict(os.environ, GV_DRY="1", VARIANTS=variants, OUT=str(root / "logs"))
    return subprocess.run(["bash", str(SCRIPT)], cwd=root, env=env, capture_output=True, text=True, timeout=60)


def test_variants_apply_and_the_tree_comes_back(tmp_path):
    make_tree(tmp_path)
    one = write_patch(tmp_path, "one.patch", "device_src/a.h", "int a = 1;\n", "int a = 10;\n")
    two = write_patch(tmp_path, "two.patch", "csrc/c.cpp", "int c;\n", "long c;\n")
    r = run(tmp_path, f"main one={one} both={one}+{two} main")
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("main", "one", "both"):
        assert f"variant {name}: patches apply" in r.stdout
    assert tree(tmp_path) == ORIGINAL


def test_a_patch_that_does_not_apply_stops_the_call(tmp_path):
    make_tree(tmp_path)
    one = write_patch(tmp_path, "one.patch", "device_src/a.h", "int a = 1;\n", "int a = 10;\n")
    stale = write_patch(tmp_path, "stale.patch", "device_src/a.h", "int b = 2;\n", "int b = 20;\n")
    (tmp_path / "device_src/a.h").write_text("int a = 1;\nint b = 5;\nint c = 3;\n")  # the tree moved on
    moved = tree(tmp_path)
    r = run(tmp_path, f"main broken={one}+{stale}")
    assert r.returncode == 1
    assert "variant broken: 'stale.patch' does not apply" in r.stdout
    assert tree(tmp_path) == moved  # one.patch, applied first, was reversed


def test_a_missing_patch_file_is_named(tmp_path):
    make_tree(tmp_path)
    r = run(tmp_path, "x=nowhere.patch")
    assert r.returncode == 1
    assert "variant x: no patch file 'nowhere.patch'" in r.stdout
    assert tree(tmp_path) == ORIGINAL


def test_each_variant_runs_with_its_own_build(tmp_path):
    """The whole path with a stand-in build: setup.py writes the variant's a.h into the '.so', and the command
    prints the .so it finds, so each log must show its own variant's text; the command's exit status is reported."""
    make_tree(tmp_path)
    (tmp_path / "setup.py").write_text(
        "import pathlib\n"
        "pathlib.Path('_gpuos_C.fake.so').write_text(pathlib.Path('device_src/a.h').read_text())\n")
    one = write_patch(tmp_path, "one.patch", "device_src/a.h", "int a = 1;\n", "int a = 10;\n")
    env = dict(os.environ, VARIANTS=f"main one={one}", CMDS="cat _gpuos_C.fake.so && echo 1 passed && exit 3",
               OUT=str(tmp_path / "logs"))
    env.pop("GV_DRY", None)
    r = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "built main" in r.stdout and "built one" in r.stdout
    assert r.stdout.count("rc=3") == 2 and r.stdout.splitlines().count("1 passed") == 2  # the picked lines
    assert "int a = 1;" in (tmp_path / "logs" / "0_0_main.log").read_text()
    assert "int a = 10;" in (tmp_path / "logs" / "0_1_one.log").read_text()
    assert tree(tmp_path) == ORIGINAL


def test_a_patch_made_against_lines_that_moved_applies_and_leaves_no_backup(tmp_path):
    """A hunk that applies at an offset (the file gained lines above it since the patch was made) applies and is
    reversed without leaving `a.h.orig` behind (patch's backup on a mismatch made the tree differ)."""
    make_tree(tmp_path)
    one = write_patch(tmp_path, "one.patch", "device_src/a.h", "int c = 3;\n", "int c = 30;\n")
    moved = "".join(f"int pad{i};\n" for i in range(5)) + ORIGINAL["device_src/a.h"]
    (tmp_path / "device_src/a.h").write_text(moved)
    r = run(tmp_path, f"one={one}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "variant one: patches apply" in r.stdout and "ERROR" not in r.stdout, r.stdout
    assert (tmp_path / "device_src/a.h").read_text() == moved
    assert not list(tmp_path.rglob("*.orig")), list(tmp_path.rglob("*.orig"))
