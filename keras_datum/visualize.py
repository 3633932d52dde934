"""Seeing the data: a captioned grid of samples, and a dataset card."""

import math
import os

import numpy as np

from keras_datum import augment as augment_lib
from keras_datum import config
from keras_datum import problems

# The splits a source folder can have (a datum export may name others).
SPLITS = ("train", "val", "test")


def check_preview_arguments(num_images, columns, path):
    """`preview()`'s own arguments, checked before the cache is made."""
    config.check_positive("num_images", num_images)
    config.check_positive("columns", columns)
    if path is not None:
        check_figure_path(path)


def check_figure_path(path):
    """Refuses a path whose extension matplotlib cannot save, before any work."""
    if not isinstance(path, (str, os.PathLike)):
        return  # A file object: matplotlib writes its default format.
    extension = os.path.splitext(os.fspath(path))[1][1:].lower()
    if not extension:
        return  # Saved as PNG, matplotlib's default.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    formats = FigureCanvasAgg(Figure()).get_supported_filetypes()
    if extension not in formats:
        raise ValueError(
            f"`path` must end in an image format matplotlib saves "
            f"({', '.join(sorted(formats))}). Received: path={path!r}"
        )


def _caption(label, class_names):
    """A short caption for one label of any label mode."""
    if label is None:
        return ""
    label = np.asarray(label)
    if label.ndim == 0:
        index = int(label)
        return class_names[index] if 0 <= index < len(class_names) else str(index)
    if class_names and label.shape[-1] == len(class_names):
        # One-hot, mixed (MixUp) or multi-hot: the classes that carry weight.
        order = np.argsort(-label)
        parts = [
            f"{class_names[i]} {label[i]:.2f}" if label[i] < 0.995 else class_names[i]
            for i in order[:2]
            if label[i] > 0.005
        ]
        return " / ".join(parts) or "(none)"
    if label.shape == (1,) and len(class_names) == 2:  # binary
        return class_names[round(float(label[0]))]
    return ", ".join(f"{v:.3g}" for v in label.reshape(-1)[:3])


def _draw_boxes(axes, boxes, class_names, box_format):
    from keras_cv import bounding_box
    from matplotlib.patches import Rectangle

    classes = boxes.get("classes", boxes.get("labels"))
    xyxy = bounding_box.convert_format(
        np.asarray(boxes["boxes"], np.float32).reshape(-1, 4),
        source=box_format,
        target="xyxy",
        image_shape=axes.images[0].get_array().shape,
    )
    for (x1, y1, x2, y2), cls in zip(np.asarray(xyxy), np.asarray(classes)):
        if cls < 0:
            continue  # Padding.
        axes.add_patch(
            Rectangle((x1, y1), x2 - x1, y2 - y1, fill=False, edgecolor="yellow", linewidth=1.5)
        )
        name = class_names[int(cls)] if int(cls) < len(class_names) else str(int(cls))
        axes.text(x1, y1, name, color="black", fontsize=7, backgroundcolor="yellow")


def _draw_mask(axes, mask):
    shown = np.ma.masked_where((mask == 0) | (mask == 255), mask)
    axes.imshow(shown, cmap="tab20", alpha=0.5, interpolation="nearest", vmin=0, vmax=20)


def preview_figure(dataset, class_names, num_images=16, columns=4, box_format="xyxy"):
    """Draws up to `num_images` unbatched `(x, y)` elements as a captioned grid.

    Detection boxes are drawn with their class names; segmentation masks are
    drawn over their images (class 0 and the ignore label left clear).

    Returns:
        A `matplotlib.figure.Figure` (no pyplot global state is touched).
    """
    from matplotlib.figure import Figure

    samples = list(dataset.take(num_images).as_numpy_iterator())
    if not samples:
        raise ValueError("There are no examples to preview in this split.")
    columns = min(columns, len(samples))
    rows = math.ceil(len(samples) / columns)
    figure = Figure(figsize=(2.2 * columns, 2.4 * rows))
    for index, sample in enumerate(samples):
        image, label = sample if isinstance(sample, tuple) else (sample, None)
        axes = figure.add_subplot(rows, columns, index + 1)
        image = np.clip(np.asarray(image, dtype=np.float32) / 255.0, 0, 1)
        if image.shape[-1] == 1:
            axes.imshow(image[..., 0], cmap="gray", vmin=0, vmax=1)
        else:
            axes.imshow(image)
        if isinstance(label, dict):  # Detection: draw the boxes.
            _draw_boxes(axes, label, class_names, box_format)
            label = None
        elif label is not None and np.ndim(label) == 3:  # Segmentation mask.
            _draw_mask(axes, np.asarray(label)[..., 0])
            label = None
        axes.set_title(_caption(label, class_names), fontsize=9)
        axes.axis("off")
    figure.tight_layout()
    register_notebook_display()
    return figure


def register_notebook_display():
    """Lets IPython show a returned `Figure` inline as a PNG.

    The preview figure is made without pyplot (no global state, no second
    copy drawn by the inline backend), so IPython needs to be told how to
    render it. Outside IPython this does nothing.
    """
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import print_figure
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    from matplotlib.figure import Figure

    formatter = shell.display_formatter.formatters["image/png"]
    formatter.for_type(Figure, lambda figure: print_figure(figure, "png"))


def summary_text(meta, invalid_files):
    """The dataset card: layout, classes with per-split counts, sizes, invalid files."""
    lines = [
        f"Dataset card: {meta['source']}",
        (f"  problem: {meta['problem']}, layout: {meta['layout']}, "
        f"exported {meta['created']} by keras_datum {meta['keras_datum_version']}"),
    ]
    splits = meta["splits"]
    lines.append(
        "  examples: " + ", ".join(f"{s} {v['num_examples']}" for s, v in splits.items())
    )
    names = meta["class_names"]
    if names and all(v.get("class_counts") for v in splits.values()):
        width = max(len(n) for n in names + ["class"])
        header = "  " + "class".ljust(width) + "".join(f"{s:>8}" for s in splits)
        lines += ["", header]
        for index, name in enumerate(names):
            counts = "".join(f"{v['class_counts'][index]:>8}" for v in splits.values())
            lines.append("  " + name.ljust(width) + counts)
    elif names:
        lines.append(f"  classes ({len(names)}): {', '.join(names)}")
    else:
        lines.append(f"  labels: {meta['label_spec']['type']}")
    lines.append("")
    for split, info in splits.items():
        sizes = info.get("image_sizes") or {}
        if sizes:
            h, w = sizes["height"], sizes["width"]
            lines.append(
                f"  {split} image size: height {h['min']}-{h['max']} "
                f"(mean {h['mean']:.0f}), width {w['min']}-{w['max']} "
                f"(mean {w['mean']:.0f})"
            )
    lines.append(f"  invalid files left out: {len(invalid_files)}")
    for entry in invalid_files:
        lines.append(f"    {entry['split']}/{entry['file']}: {entry['reason']}")
    return "\n".join(lines)


class DatasetViews:
    """The `DatumDataset` methods that show its data: a grid of samples and
    a dataset card (a base class of `DatumDataset`, which they read)."""

    def preview(
        self,
        split="train",
        *,
        augment=None,
        batch_augment=None,
        num_images=16,
        columns=4,
        path=None,
        seed=None,
    ):
        """Draws a grid of samples after augmentation, captioned by class.

        Args:
            split: `"train"`, `"val"` or `"test"`. Defaults to `"train"`.
            augment: per-example augmentation to show (see `train()`).
            batch_augment: per-batch augmentation to show (MixUp shows the
                mixed classes with their weights).
            num_images: how many samples. Defaults to 16.
            columns: grid columns. Defaults to 4.
            path: when given, the figure is saved there (PNG by extension).
            seed: seeds the shuffle and augmentation of the samples.

        Returns:
            The `matplotlib.figure.Figure`; in a notebook it displays inline
            as the cell's last expression (or with `display(...)`).
        """
        # Everything that can be checked without the cache, before it is made.
        check_preview_arguments(num_images, columns, path)
        config.check_seed(seed)
        augment_lib.resolve(augment, batch_augment, None, None)
        if not self._source.in_place and split not in SPLITS:
            raise ValueError(
                f"`split` must be one of {list(SPLITS)}. Received: split={split!r}"
            )
        if self._metadata().problem == problems.text.NAME:
            raise ValueError(
                "preview() draws images; for a text dataset look at "
                "`list(ds.train(batch_size=None).take(5))` instead."
            )
        batch = max(2, num_images) if batch_augment is not None else None
        dataset = self._split(
            split, batch, split == "train", False, seed, augment, batch_augment, preview=True
        )
        figure = preview_figure(
            dataset if batch is None else dataset.unbatch(), self.class_names or [],
            num_images=num_images, columns=columns,
            box_format=self._read.bounding_box_format,
        )
        if path is not None:
            figure.savefig(path, dpi=80)
        return figure

    def summary(self, print_fn=print):
        """Prints (and returns) a dataset card: classes, counts, sizes, invalid files."""
        text = summary_text(self.info, self.invalid_files)
        if print_fn is not None:
            print_fn(text)
        return text
