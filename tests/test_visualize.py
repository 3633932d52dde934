import os

import keras
import numpy as np
import pytest
from PIL import Image

from keras_datum import DatumDataset
from keras_datum import cli
from keras_datum.demo import make_shapes_dataset


@pytest.fixture
def shapes(tmp_path):
    return make_shapes_dataset(str(tmp_path / "shapes"), images_per_class=6, image_size=32)


def _not_blank(path):
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)
    return pixels.std() > 10


def test_preview_png_has_a_captioned_grid(shapes, tmp_path):
    ds = DatumDataset(shapes, image_size=(32, 32), verbose=False)
    path = tmp_path / "preview.png"
    figure = ds.preview(
        augment=keras.layers.RandomFlip("horizontal"), num_images=8, columns=4, path=path
    )
    image = Image.open(path)
    assert image.format == "PNG"
    assert image.size == (int(2.2 * 4 * 80), int(2.4 * 2 * 80))
    assert _not_blank(path)
    titles = [axes.get_title() for axes in figure.axes]
    assert len(titles) == 8
    assert set(titles) <= {"circle", "square", "triangle"}


def test_preview_after_mixup_shows_mixed_captions(shapes, tmp_path):
    ds = DatumDataset(shapes, image_size=(32, 32), label_mode="categorical", verbose=False)
    figure = ds.preview(batch_augment=keras.layers.MixUp(), num_images=6, seed=2)
    titles = [axes.get_title() for axes in figure.axes]
    assert any(" / " in t for t in titles), titles


def test_cli_preview(shapes, tmp_path, capsys):
    path = tmp_path / "cli.png"
    assert cli.main(["preview", shapes, "--path", str(path), "--num-images", "4", "--image-size", "32"]) == 0
    assert _not_blank(path)
    assert f"Wrote {path}" in capsys.readouterr().out


def test_cli_preview_refuses_a_split_name_before_the_export(shapes, tmp_path, capsys):
    cache = tmp_path / "cache"
    assert cli.main(["preview", shapes, "--split", "tset", "--cache-dir", str(cache)]) == 2
    assert "`split` must be one of ['train', 'val', 'test']. Received: split='tset'" in capsys.readouterr().err
    assert not cache.exists()


def test_summary_card(shapes, tmp_path):
    (tmp_path / "shapes" / "circle" / "broken.png").write_bytes(b"")
    ds = DatumDataset(shapes, image_size=(32, 32), verbose=False)
    with pytest.warns(UserWarning):
        ds.export()
    lines = []
    text = ds.summary(print_fn=lines.append)
    assert lines == [text]
    assert "examples: train 15, val 3" in text
    table = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.strip().startswith(("circle", "square", "triangle"))}
    assert table == {"circle": ["5", "1"], "square": ["5", "1"], "triangle": ["5", "1"]}
    assert "train image size: height 32-32 (mean 32), width 32-32 (mean 32)" in text
    assert "invalid files left out: 1" in text
    assert "train/circle/broken.png: empty file (0 bytes)" in text or "val/circle/broken.png: empty file (0 bytes)" in text


def test_preview_draws_detection_boxes_and_masks(tmp_path):
    import sys
    sys.path.insert(0, os.path.dirname(__file__))
    from detection_data import draw_items, write_voc
    from test_segmentation import _draw, write_pairs

    voc = write_voc(tmp_path / "voc", draw_items(6))
    figure = DatumDataset(voc, image_size=(40, 60), verbose=False).preview(
        num_images=4, path=tmp_path / "boxes.png", seed=1
    )
    assert sum(len(axes.patches) for axes in figure.axes) > 0
    assert _not_blank(tmp_path / "boxes.png")
    pairs = write_pairs(tmp_path / "pairs", {"train": _draw(0)})
    figure = DatumDataset(pairs, image_size=(24, 32), verbose=False).preview(num_images=2)
    assert all(len(axes.images) == 2 for axes in figure.axes)  # Image and mask.


def test_preview_refuses_text(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.txt").write_text("hello")
    with pytest.raises(ValueError, match="preview\\(\\) draws images"):
        DatumDataset(str(tmp_path / "src"), verbose=False).preview()


def test_the_preview_command_on_text_says_why_it_draws_nothing(tmp_path, capsys):
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "x.txt").write_text("hello")
    assert cli.main(["preview", str(tmp_path / "src"), "--cache-dir", str(tmp_path / "cache")]) == 2
    assert "preview() draws images; for a text dataset" in capsys.readouterr().err
