import io
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import make_class_folders

from keras_datum import cli


def test_export_then_info(tmp_path, capsys):
    root = make_class_folders(tmp_path / "src", {"a": 5, "b": 5})
    (tmp_path / "src" / "a" / "broken.png").write_bytes(b"nope")
    cache_dir = str(tmp_path / "cache")
    assert cli.main(["export", root, "--cache-dir", cache_dir, "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "Classes (2): a, b" in out
    assert "train: 8 examples in 1 shards" in out
    assert "val: 2 examples" in out
    assert "Invalid files left out: 1" in out
    assert os.path.isfile(os.path.join(cache_dir, "metadata.json"))

    assert cli.main(["info", cache_dir]) == 0
    out = capsys.readouterr().out
    assert f"Cache: {cache_dir}" in out
    assert "a/broken.png: not an image file" in out


def test_info_on_a_source_folder_finds_the_default_cache(tmp_path, capsys):
    root = make_class_folders(tmp_path / "src", {"a": 3})
    assert cli.main(["export", root]) == 0
    capsys.readouterr()
    assert cli.main(["info", root]) == 0
    assert "train: 2 examples" in capsys.readouterr().out


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert cli.main(["export", str(tmp_path / "missing")]) == 2
    assert "Source folder not found" in capsys.readouterr().err
    os.makedirs(tmp_path / "empty")
    assert cli.main(["info", str(tmp_path / "empty")]) == 2
    assert "No keras_datum cache found" in capsys.readouterr().err
    # An OSError (here: a cache folder under a regular file) is reported too.
    root = make_class_folders(tmp_path / "src", {"a": 2})
    (tmp_path / "a_file").write_text("x")
    assert cli.main(["export", root, "--cache-dir", str(tmp_path / "a_file" / "cache")]) == 2
    assert "keras-datum export: error: " in capsys.readouterr().err


def test_info_and_verify_on_a_source_cover_each_carve(tmp_path, capsys):
    root = make_class_folders(tmp_path / "src", {"a": 4, "b": 4})
    assert cli.main(["export", root]) == 0
    assert cli.main(["export", root, "--validation-split", "0.5"]) == 0
    capsys.readouterr()
    assert cli.main(["info", root]) == 0
    out = capsys.readouterr().out
    assert out.count("Cache: ") == 2
    assert "val: 2 examples" in out and "val: 4 examples" in out
    assert cli.main(["verify", root]) == 0
    assert capsys.readouterr().out.count("OK: ") == 2
    # Reading with the same carve flags finds that carve's cache: no export.
    assert cli.main(["benchmark", root, "--validation-split", "0.5", "--split", "val",
                     "--image-size", "16", "--epochs", "1", "--batch-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "export: none, the cache was up to date" in out
    assert "val: 4 examples" in out


def test_demo_shrunk(tmp_path, capsys):
    code = cli.main(
        [
            "demo",
            "--data-dir", str(tmp_path / "shapes"),
            "--images-per-class", "12",
            "--image-size", "32",
            "--epochs", "1",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "Classes: ['circle', 'square', 'triangle']" in out
    assert "Validation accuracy:" in out
    assert len(os.listdir(tmp_path / "shapes" / "circle")) == 12
    assert sorted(p.name for p in tmp_path.glob("shapes*")) == ["shapes"]  # Drawn beside, then renamed.
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tmp_path / "shapes").st_mode & 0o777 == 0o777 & ~umask


def _demo_in_a_process(tmp_path, **env):
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    environ.update(KERAS_HOME=str(tmp_path / "home"), **env)
    return subprocess.run(
        [sys.executable, "-c", "import sys; from keras_datum import cli; sys.exit(cli.main())",
         "demo", "--data-dir", str(tmp_path / "shapes"), "--images-per-class", "6",
         "--image-size", "16", "--epochs", "1"],
        capture_output=True, text=True, env=environ, timeout=600,
    )


@pytest.mark.slow
def test_the_demo_prints_only_what_concerns_the_user(tmp_path):
    quiet = _demo_in_a_process(tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    assert "Validation accuracy:" in quiet.stdout
    # TensorFlow's C++ start-up lines and Keras's warning about `shuffle=True`.
    for noise in ("absl", "cuda", "cuInit", "oneDNN", "shuffle", "Warning"):
        assert noise not in quiet.stderr, quiet.stderr
    # A level the user sets is theirs: TensorFlow's own lines come back.
    loud = _demo_in_a_process(tmp_path, TF_CPP_MIN_LOG_LEVEL="0")
    assert loud.returncode == 0, loud.stderr
    assert "absl" in loud.stderr or "oneDNN" in loud.stderr


def test_importing_the_package_starts_no_tensorflow():
    code = "import sys, keras_datum; assert 'tensorflow' not in sys.modules; keras_datum.DatumDataset"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_a_demo_stopped_while_drawing_leaves_no_folder_to_train_on(tmp_path, monkeypatch):
    from keras_datum import demo

    drawn = []
    real_draw = demo.draw_shape

    def draw_then_stop(*args):
        if len(drawn) == 5:
            raise KeyboardInterrupt  # Ctrl-C halfway through the drawing.
        drawn.append(args)
        return real_draw(*args)

    data_dir = tmp_path / "shapes"
    # A folder of the user's that happens to have the name a drawing in
    # progress might take: it is never touched.
    (tmp_path / "shapes.partial").mkdir()
    (tmp_path / "shapes.partial" / "thesis.txt").write_text("draft")
    monkeypatch.setattr(demo, "draw_shape", draw_then_stop)
    with pytest.raises(KeyboardInterrupt):
        demo.run_demo(data_dir=data_dir, images_per_class=4, image_size=16, epochs=1, verbose=False)
    # Nothing a later run would take as complete, and nothing left behind.
    assert sorted(p.name for p in tmp_path.glob("shapes*")) == ["shapes.partial"]
    monkeypatch.setattr(demo, "draw_shape", real_draw)
    demo.run_demo(data_dir=data_dir, images_per_class=4, image_size=16, epochs=1, verbose=False)
    assert sorted(len(os.listdir(data_dir / s)) for s in demo.SHAPES) == [4, 4, 4]
    assert sorted(p.name for p in tmp_path.glob("shapes*")) == ["shapes", "shapes.partial"]
    assert (tmp_path / "shapes.partial" / "thesis.txt").read_text() == "draft"


def test_a_drawing_left_by_a_killed_demo_is_removed_by_the_next_run(tmp_path):
    from keras_datum import demo

    data_dir = tmp_path / "shapes"
    # A real run, killed (SIGKILL: no finally runs) while it draws.
    child = subprocess.Popen([
        sys.executable, "-c",
        "import sys; from keras_datum import demo; "
        "demo.run_demo(data_dir=sys.argv[1], images_per_class=100000, image_size=16, verbose=False)",
        str(data_dir),
    ])
    try:
        deadline = time.monotonic() + 120
        while not any(p.is_dir() and len(os.listdir(p)) > 3 for p in tmp_path.glob("shapes.partial-*/*")):
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        child.kill()
        child.wait()
    [dead] = tmp_path.glob("shapes.partial-*")
    # The user's folders of names like a drawing's, without the mark, stay.
    for name in ("shapes.partial-mine1234", "shapes.partial-x"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "thesis.txt").write_text("draft")
    demo.run_demo(data_dir=data_dir, images_per_class=4, image_size=16, epochs=1, verbose=False)
    assert not dead.exists()
    assert sorted(p.name for p in tmp_path.glob("shapes*")) == [
        "shapes", "shapes.partial-mine1234", "shapes.partial-x"
    ]
    assert not (data_dir / demo._DRAWING_MARK).exists()
    assert sorted(len(os.listdir(data_dir / s)) for s in demo.SHAPES) == [4, 4, 4]


def test_a_demo_that_loses_the_race_to_another_drawing_uses_it(tmp_path, monkeypatch):
    # On a file system without locks two runs may draw at once: the one that
    # renames second keeps the first one's folder.
    import contextlib

    from keras_datum import demo

    data_dir = tmp_path / "shapes"
    real_make = demo.make_shapes_dataset

    def another_run_finishes_first(directory, *args):
        real_make(directory, *args)
        real_make(str(data_dir), *args)

    monkeypatch.setattr(demo, "_folder_lock", lambda folder: contextlib.nullcontext(False))
    monkeypatch.setattr(demo, "make_shapes_dataset", another_run_finishes_first)
    demo.run_demo(data_dir=data_dir, images_per_class=4, image_size=16, epochs=1, verbose=False)
    assert sorted(p.name for p in tmp_path.glob("shapes*")) == ["shapes"]


def test_demo_arguments_it_cannot_train_on_are_refused_before_drawing(tmp_path, capsys):
    for flags, message in (
        (["--image-size", "7"], "`image_size` must be at least 8"),
        (["--images-per-class", "2"], "`images_per_class` must be at least 3"),
    ):
        assert cli.main(["demo", "--data-dir", str(tmp_path / "shapes"), *flags]) == 2
        assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "shapes")


def test_export_an_unlabelled_csv_layout_with_a_size_cap(tmp_path, capsys):
    from PIL import Image

    os.makedirs(tmp_path / "src" / "train")
    for name in ("a", "b"):
        Image.new("RGB", (400, 300)).save(tmp_path / "src" / "train" / f"{name}.png")
    (tmp_path / "src" / "train.csv").write_text("filename\na\nb\n")
    cache_dir = str(tmp_path / "cache")
    assert cli.main(["export", str(tmp_path / "src"), "--cache-dir", cache_dir,
                     "--max-image-side", "100", "--validation-split", "0"]) == 0
    assert "train: 2 examples" in capsys.readouterr().out
    from keras_datum import cache

    meta = cache.read_metadata(cache_dir)
    assert meta["splits"]["train"]["image_sizes"]["width"]["max"] == 100


def test_benchmark_prints_each_epoch(tmp_path, capsys):
    import json

    root = make_class_folders(tmp_path / "src", {"a": 10, "b": 10})
    cache_dir = str(tmp_path / "cache")
    args = ["benchmark", root, "--cache-dir", cache_dir, "--image-size", "16", "--batch-size", "4"]
    assert cli.main([*args, "--epochs", "2", "--json", "--no-cache"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["exported"] is True and result["cache"]["on"] is False
    assert [epoch["images"] for epoch in result["epochs"]] == [16, 16]
    assert cli.main([*args, "--split", "val", "--epochs", "1", "--image-dtype", "uint8"]) == 0
    out = capsys.readouterr().out
    assert "val: 4 examples, batches of 4" in out
    assert "export: none, the cache was up to date" in out
    assert "epoch 1: " in out and "epoch 2: " not in out


@pytest.mark.parametrize(
    "argv, named",
    [
        (["benchmark", "SRC", "--epochs", "0"], "argument --epochs: must be a positive integer, got '0'"),
        (["benchmark", "SRC", "--image-size", "x"], "argument --image-size: must be an integer, got 'x'"),
        (["export", "SRC", "--validation-split", "1.5"], "argument --validation-split: must be a number in [0, 1)"),
        (["export", "SRC", "--max-image-side", "-1"], "argument --max-image-side: must be 0 or a positive"),
        (["preview", "SRC", "--num-images", "-3"], "argument --num-images: must be a positive integer"),
        (["export", "SRC", "--seed", "-1"], "argument --seed: must be 0 or a positive integer, got '-1'"),
    ],
)
def test_bad_numbers_are_named_by_their_flag_before_any_work(tmp_path, capsys, argv, named):
    source = make_class_folders(tmp_path / "src", {"a": 2})
    argv = [source if arg == "SRC" else arg for arg in argv]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err
    # Nothing was exported: the flag was refused while parsing.
    from keras_datum import store

    assert not os.path.exists(store.default_cache_dir(source))


def test_preview_and_benchmark_read_an_unlabelled_csv_source(tmp_path, capsys):
    import numpy as np
    from conftest import random_image

    root = tmp_path / "src"
    os.makedirs(root / "train")
    rng = np.random.default_rng(0)
    with open(root / "train.csv", "w") as f:
        f.write("filename\n")
        for i in range(6):
            random_image(rng).save(root / "train" / f"{i}.png")
            f.write(f"{i}\n")
    path = str(tmp_path / "grid.png")
    assert cli.main(["preview", str(root), "--num-images", "4", "--path", path]) == 0
    assert os.path.getsize(path) > 0
    assert cli.main(["benchmark", str(root), "--image-size", "16", "--epochs", "1",
                     "--batch-size", "2"]) == 0
    assert "train: 5 examples" in capsys.readouterr().out


def test_benchmark_with_follow_links_finds_that_export(tmp_path, capsys):
    root = make_class_folders(tmp_path / "src", {"a": 4, "b": 4})
    assert cli.main(["export", root, "--follow-links", "--image-size", "16"]) == 0
    capsys.readouterr()
    assert cli.main(["benchmark", root, "--follow-links", "--image-size", "16", "--epochs", "1",
                     "--batch-size", "2"]) == 0
    assert "export: none, the cache was up to date" in capsys.readouterr().out


def _write_bytes_named(folder, name, data):
    """Writes `data` to `folder/name`, `name` being raw bytes (not UTF-8)."""
    fd = os.open(os.path.join(os.fsencode(folder), name), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "terminal",
    [{"PYTHONIOENCODING": "utf-8:strict"}, {"LC_ALL": "C", "LANG": "C"}],
    ids=["strict_utf8", "c_locale"],
)
@pytest.mark.slow
def test_export_and_info_print_file_names_that_are_not_utf8_escaped(tmp_path, terminal):
    import numpy as np
    from conftest import random_image

    root = make_class_folders(tmp_path / "src", {"a": 3})
    png = io.BytesIO()
    random_image(np.random.default_rng(5)).save(png, format="PNG")
    _write_bytes_named(os.path.join(root, "a"), b"caf\xe9.png", png.getvalue())  # Latin-1 name.
    _write_bytes_named(os.path.join(root, "a"), b"bad\xff.png", b"not an image")
    cache_dir = str(tmp_path / "cache")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "LC_ALL", "LANG")}
    for argv in (["export", root, "--cache-dir", cache_dir, "--image-size", "8"],
                 ["info", cache_dir]):
        done = subprocess.run(
            [sys.executable, "-m", "keras_datum.cli", *argv],
            capture_output=True, env={**env, **terminal}, timeout=300,
        )
        out = done.stdout.decode("ascii", "replace")
        assert done.returncode == 0, done.stderr.decode("utf-8", "replace")[-2000:]
        assert "Invalid files left out: 1" in out
        assert "a/bad\\xff.png: not an image file" in out
        assert b"\xff" not in done.stdout  # Escaped, not written raw.
    with open(os.path.join(cache_dir, "metadata.json")) as f:
        assert sum(s["num_examples"] for s in json.load(f)["splits"].values()) == 4
