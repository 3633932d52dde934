"""Semantic segmentation: VOC `SegmentationClass/` and `images/` + `masks/` folders.

```
Pascal VOC                             images + masks
root/                                  root/
  JPEGImages/        0001.jpg            images/  0001.jpg  (or images/train/ ...)
  SegmentationClass/ 0001.png            masks/   0001.png  (or masks/train/ ...)
  ImageSets/Segmentation/train.txt       classes.txt / labels.txt (optional)
  (optional; also ImageSets/train.txt    train.txt, val.txt (optional, with a
  or train.txt, val.txt at the root)       flat images/ folder)
```

A split list holds one id (a file name without its extension) a line. An id
listed twice, or in two lists, is refused; so are two images sharing a name
(`a.jpg` and `a.png`), since the mask `a.png` would fit either.

Masks are single-channel PNGs of class indices: VOC's palette PNGs are read as
their palette indices (not colours). 255 is the ignore label (VOC's object
borders); it is kept as is, and the padding added by `pad_to_aspect_ratio` is
255 too. Pass `ignore_class=255` to `keras.losses.SparseCategoricalCrossentropy`.
Masks are resized with nearest neighbour; `y` is int32 `(height, width, 1)`.
"""

import io
import os

import numpy as np
import tensorflow as tf
from PIL import Image

from keras_datum import crop
from keras_datum import encode as encode_lib
from keras_datum import errors
from keras_datum import images
from keras_datum import sources
from keras_datum import storage
from keras_datum.problems import base
from keras_datum.problems import labels
from keras_datum.sources import ExampleRecord
from keras_datum.sources import Layout

NAME = "segmentation"
IGNORE_LABEL = 255
VOC_CLASS_NAMES = [
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car",
    "cat", "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person",
    "pottedplant", "sheep", "sofa", "train", "tvmonitor",
]
_SPLITS = sources.SPLIT_NAMES
_MASK_FORMATS = (".png",)


def find_layout(root, follow_links=False):
    if storage.isdir(os.path.join(root, "SegmentationClass")) and storage.isdir(
        os.path.join(root, "JPEGImages")
    ):
        return _find_voc(root)
    if storage.isdir(os.path.join(root, "images")) and storage.isdir(
        os.path.join(root, "masks")
    ):
        return _find_pairs(root, follow_links)
    return None


def _class_names(root, default):
    names, path = sources.read_class_names(root)
    return (names, [path]) if names is not None else (default, [])


def _layout(name, splits, class_names, extra):
    if class_names:  # Each mask's ids are checked against them at export.
        for records in splits.values():
            for record in records:
                record.annotation["num_classes"] = len(class_names)
    return Layout(
        name=name,
        problem=NAME,
        splits=splits,
        info={
            "class_names": class_names,
            "label_spec": {
                "type": "segmentation",
                "num_classes": len(class_names),
                "ignore_label": IGNORE_LABEL,
            },
        },
        extra_files=extra,
    )


def _record(root, image_path, mask_path):
    return ExampleRecord(
        path=image_path,
        relpath=sources.relative_path(image_path, root),
        annotation={"mask": mask_path},
    )


def _find_voc(root):
    image_dir = os.path.join(root, "JPEGImages")
    mask_dir = os.path.join(root, "SegmentationClass")
    class_names, extra = _class_names(root, VOC_CLASS_NAMES)
    images_by_stem = sources.unique_stems(_files_in(image_dir, sources.IMAGE_FORMATS), image_dir)
    lists = sources.voc_split_lists(root, "Segmentation")
    if lists:
        extra.extend(lists.values())
        ids = sources.read_split_lists(lists)
    else:
        ids = {"train": [(os.path.splitext(os.path.basename(p))[0], mask_dir)
                         for p in _files_in(mask_dir, _MASK_FORMATS)]}
    splits = {}
    for split, stems in ids.items():
        splits[split] = []
        for stem, where in stems:
            mask = sources.resolve_inside(mask_dir, stem + ".png", where)
            # A missing image or mask is an invalid example, reported at export.
            image = images_by_stem.get(stem) or sources.resolve_inside(
                image_dir, stem + ".jpg", where
            )
            splits[split].append(_record(root, image, mask))
            extra.append(mask)  # A changed mask must trigger a re-export.
    if not splits.get("train"):
        raise ValueError(f"The VOC segmentation folder {root!r} lists no masks.")
    return _layout("voc_segmentation", splits, class_names, extra)


def _files_in(directory, formats):
    """The visible files of `directory` (not its subfolders) with an extension in `formats`."""
    return [
        os.path.join(directory, n)
        for n in sorted(storage.listdir(directory))
        if not n.startswith(".") and n.lower().endswith(formats)
    ]


def _find_pairs(root, follow_links):
    image_root, mask_root = os.path.join(root, "images"), os.path.join(root, "masks")
    folders = _pair_folders(image_root, mask_root)
    lists = sources.voc_split_lists(root, "Segmentation")
    if lists and folders != {"train": ""}:
        raise ValueError(
            f"{image_root!r} holds split folders, and {sorted(lists.values())} "
            "list splits too. Use one of the two: remove the lists, or put "
            "the images in one folder."
        )
    class_names, extra = _class_names(root, [])
    extra.extend(lists.values())
    splits = {}
    for split, folder in folders.items():
        image_dir = os.path.join(image_root, folder) if folder else image_root
        mask_dir = os.path.join(mask_root, folder) if folder else mask_root
        masks = sources.unique_stems(
            sources.iter_image_files(mask_dir, follow_links, _MASK_FORMATS), mask_dir
        )
        images_by_stem = sources.unique_stems(
            sources.iter_image_files(image_dir, follow_links), image_dir
        )
        if lists:
            listed = {
                list_split: [
                    (stem, _listed_image(images_by_stem, stem, where, image_dir))
                    for stem, where in stems
                ]
                for list_split, stems in sources.read_split_lists(lists).items()
            }
        else:
            listed = {split: list(images_by_stem.items())}
        for name, pairs in listed.items():
            splits[name] = [
                _pair(root, image, stem, masks, mask_dir, extra) for stem, image in pairs
            ]
    sources.refuse_files_in_two_splits(
        {split: [r.path for r in records] for split, records in splits.items()}, follow_links
    )
    if not splits.get("train"):
        raise ValueError(f"No images found in {os.path.join(image_root, folders.get('train', ''))!r}.")
    return _layout("image_mask_pairs", splits, class_names, extra)


def _pair_folders(image_root, mask_root):
    """{split: folder} of `images/<split>/` folders, each with its
    `masks/<split>/`; `{"train": ""}` for one flat `images/` folder."""
    subdirs = sources.visible_subdirs(image_root)
    named = [d for d in subdirs if d in _SPLITS]
    if not named:
        return {"train": ""}
    if len(named) < len(subdirs):
        raise ValueError(
            f"{image_root!r} holds the split folders {named} beside "
            f"{[d for d in subdirs if d not in _SPLITS]}, so it is unclear whether "
            "its images are split. Move the other folders into a split folder, or "
            "rename the split folders."
        )
    folders = sources.split_folders(subdirs, image_root)
    sources.require_train(folders, image_root, "an 'images/train/' folder")
    for folder in folders.values():
        if not storage.isdir(os.path.join(mask_root, folder)):
            raise ValueError(
                f"{os.path.join(image_root, folder)!r} has no "
                f"{os.path.join(mask_root, folder)!r}: when images are in split "
                "folders, their masks are in split folders of the same names."
            )
    return folders


def _listed_image(images_by_stem, stem, where, image_dir):
    if stem not in images_by_stem:
        raise ValueError(f"{where}: lists {stem!r}, but {image_dir!r} has no image of that name.")
    return images_by_stem[stem]


def _pair(root, image, stem, masks, mask_dir, extra):
    # A missing mask is an invalid example, reported at export.
    mask = masks.get(stem, os.path.join(mask_dir, stem + ".png"))
    extra.append(mask)  # A changed (or added) mask must trigger a re-export.
    return _record(root, image, mask)


# --- Export -------------------------------------------------------------------


def features(info):
    return {**images.IMAGE_FEATURES, "mask": {"dtype": "string", "shape": []}}


# Peak bytes per mask pixel while a mask is read and stored (decoded, as an
# array, as uint8, its values counted, resized, encoded): an estimate on the
# high side of the 32-bit modes', for `encode.huge_image_slot`.
MASK_BYTES_PER_PIXEL = 16


def _read_mask(path):
    """A mask's class indices as uint8, read one huge mask at a time across
    the export's workers (see `encode.huge_image_slot`)."""
    try:
        mask = Image.open(io.BytesIO(storage.read_bytes(path)))
        with encode_lib.huge_image_slot(MASK_BYTES_PER_PIXEL * mask.width * mask.height):
            mask.load()
            return _mask_values(mask, path)
    except errors.InvalidExampleError:
        raise
    except FileNotFoundError:
        raise errors.InvalidExampleError(f"mask file not found: {path}") from None
    except Exception as e:  # noqa: BLE001 (Pillow raises many types for bad data)
        raise errors.InvalidExampleError(f"mask {path} is not a readable image ({e})") from None


def _mask_values(mask, path):
    if mask.mode not in ("P", "L", "I", "I;16", "1"):
        raise errors.InvalidExampleError(
            f"mask {path} is a {mask.mode} image; masks must be palette or "
            "grayscale PNGs of class indices"
        )
    values = np.asarray(mask)
    if values.max(initial=0) > 255 or values.min(initial=0) < 0:
        raise errors.InvalidExampleError(f"mask {path} has values outside 0..255")
    return values.astype(np.uint8)


def encode(record, options):
    """Validates the image and its mask (same size, class indices); stores both.

    When the image is shrunk to the export's size cap, the mask is shrunk to
    the same size with nearest neighbour.
    """
    features_out, stats, source_size = images.encode_features(
        record.path, options.max_image_side
    )
    values = _read_mask(record.annotation["mask"])
    if values.shape != source_size:
        raise errors.InvalidExampleError(
            f"mask {record.annotation['mask']} is {values.shape[1]}x{values.shape[0]}, "
            f"the image is {source_size[1]}x{source_size[0]}"
        )
    num_classes = record.annotation.get("num_classes")
    if num_classes:
        past = sorted(
            v for v in np.unique(values).tolist() if v >= num_classes and v != IGNORE_LABEL
        )
        if past:
            raise errors.InvalidExampleError(
                f"mask {record.annotation['mask']} has class ids {past[:8]} past the "
                f"{num_classes} classes listed (0..{num_classes - 1}, and "
                f"{IGNORE_LABEL} to ignore)"
            )
    mask = Image.fromarray(values, mode="L")
    stored_size = (stats["width"], stats["height"])
    if mask.size != stored_size:
        mask = mask.resize(stored_size, Image.Resampling.NEAREST)
    buffer = io.BytesIO()
    mask.save(buffer, format="PNG")
    features_out["mask"] = buffer.getvalue()
    stats["mask_values"] = set(np.unique(values).tolist())
    return features_out, stats


# --- Reading ----------------------------------------------------------------


def check_read_options(info, options):
    labels.refuse_class_label_modes(
        options, "a segmentation dataset yields masks of class indices"
    )


def resize_mask(mask, options):
    """Nearest-neighbour resize; padding gets the ignore label, not class 0."""
    shifted = tf.cast(mask, tf.int32) + 1  # Padding (0) becomes -1 below.
    resized = images.resize(shifted, options, method="nearest")
    resized = tf.cast(resized, tf.int32) - 1
    return tf.where(resized < 0, IGNORE_LABEL, resized)


def decode(parsed, info, options, seed=None):
    """The image and its mask at `image_size`; with a crop `seed`, both
    cut to the image's window (see `images.decode_window`)."""
    mask = tf.io.decode_png(parsed["mask"], channels=1)
    if options.random_resized_crop is None or seed is None:
        image = images.decode_and_resize(parsed, options)
    else:
        pixels, window = images.decode_window(parsed, options, seed)
        options = images.window_options(options)
        image, mask = images.resize(pixels, options), crop.cropped(mask, window)
    return {
        "images": image,
        "segmentation_masks": tf.cast(resize_mask(mask, options), tf.float32),
    }


# Keras layers whose mask transform blends the masks of two images (or of
# several chains) by weight: the result holds class ids found in neither.
_MASK_BLENDING = ("MixUp", "AugMix")
# Keras layers that paste another image's patch into the masks wrongly
# (Keras 3.15's CutMix gives masks of the images' channel count).
_MASK_PASTING = ("CutMix",)
# Keras crops that resize instead (bilinearly) when the crop is larger than
# the image.
_CROPS = ("RandomCrop", "CenterCrop")


def check_augmentation(augmentation, options):
    """Refuses layers that would move the image but not its mask, or that
    would make up class ids in the mask."""
    from keras_datum import augment

    height, width = options.image_size
    for step in augmentation.layers:
        name = type(step).__name__
        keras_layer = augment.image_layer_family(step) == "keras"
        if keras_layer and name in _MASK_PASTING:
            raise ValueError(
                f"The {augmentation.argument} layer {name} (name={step.name!r}) "
                "does not cut the masks as it cuts the images (in Keras, its masks "
                "come out with the images' channels), so it would misalign images "
                "and masks. Leave it out of a segmentation pipeline."
            )
        if keras_layer and name in _MASK_BLENDING:
            raise ValueError(
                f"The {augmentation.argument} layer {name} (name={step.name!r}) "
                "blends the masks of two images by weight, which makes class ids "
                "that are in neither mask. Leave it out of a segmentation pipeline."
            )
        if keras_layer and name in _CROPS and (step.height > height or step.width > width):
            raise ValueError(
                f"The {augmentation.argument} layer {name} (name={step.name!r}) crops "
                f"{step.height}x{step.width}, more than image_size {height}x{width}: "
                "it would resize the masks bilinearly instead, which makes class "
                "ids that are not in the mask. "
                "Crop at most image_size, or raise image_size."
            )
        if not _transforms_masks(step):
            raise ValueError(
                f"The {augmentation.argument} layer {type(step).__name__} "
                f"(name={step.name!r}) cannot transform segmentation masks, so "
                "it would misalign images and masks. Use layers that transform "
                "segmentation_masks (keras.layers.RandomFlip, RandomCrop, "
                "RandomRotation and RandomZoom; keras_cv.layers.RandomFlip, "
                "RandomRotation and RandomTranslation, ...)."
            )


def _transforms_masks(layer):
    from keras_datum import augment

    keras_base, keras_cv_base, keras_cv_vectorized = augment.image_layer_bases()
    cls = type(layer)
    checks = [
        (keras_cv_vectorized, "augment_segmentation_masks"),
        (keras_cv_base, "augment_segmentation_mask"),
        (keras_base, "transform_segmentation_masks"),
    ]
    for layer_base, method in checks:
        if layer_base is not None and issubclass(cls, layer_base):
            if getattr(cls, method) is not getattr(layer_base, method):
                return True
            # Keras's geometric layers (RandomRotation, RandomZoom, ...) keep
            # the base's mask transform, which runs their `_transform_images`
            # with nearest-neighbour interpolation.
            return (layer_base is keras_base
                    and cls._transform_images is not layer_base._transform_images)
    return False  # Some other layer: it knows nothing of the masks key.


def to_keras(inputs):
    return inputs["images"], tf.cast(tf.round(inputs["segmentation_masks"]), tf.int32)


class Segmentation(base.Problem):
    """The segmentation problem's hooks: this module's functions."""

    NAME = NAME
    OPTIONS = base.IMAGE_OPTIONS
    find_layout = staticmethod(find_layout)
    features = staticmethod(features)
    encode = staticmethod(encode)
    decode = staticmethod(decode)
    to_keras = staticmethod(to_keras)
    check_read_options = staticmethod(check_read_options)
    check_augmentation = staticmethod(check_augmentation)


PROBLEM = Segmentation()
