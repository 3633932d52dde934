"""Object detection: Pascal VOC, COCO and YOLO sources; KerasCV box dicts out.

The source layouts are found by `detection_layouts`. Boxes are stored
relative to the stored (upright) image, as `rel_xyxy`, after clipping to the
image (counted as `boxes_clipped`) and dropping boxes with no area (counted
as `boxes_dropped`). Images without objects are kept.
"""

import math

import tensorflow as tf

from keras_datum import crop
from keras_datum import images
from keras_datum import notices
from keras_datum.problems import base
from keras_datum.problems import detection_layouts
from keras_datum.problems import labels

NAME = detection_layouts.NAME
BOUNDING_BOX_FORMATS = (
    "xyxy",
    "rel_xyxy",
    "xywh",
    "rel_xywh",
    "center_xywh",
    "center_yxhw",
    "yxyx",
    "rel_yxyx",
)
CLASS_KEYS = ("classes", "labels")


# --- Export -----------------------------------------------------------------


def features(info):
    return {
        **images.IMAGE_FEATURES,
        "objects/boxes": {"dtype": "float32", "shape": None},
        "objects/classes": {"dtype": "int64", "shape": None},
    }


def _to_rel_xyxy(box, box_format, height, width):
    if box_format == "rel_center_xywh":
        cx, cy, w, h = box
        return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]
    x1, y1, x2, y2 = box
    return [x1 / width, y1 / height, x2 / width, y2 / height]


def encode(record, options):
    """Validates the image; clips boxes to it and drops empty ones (counted)."""
    features_out, stats, (height, width) = images.encode_features(
        record.path, options.max_image_side
    )
    annotation = record.annotation
    boxes, classes = [], []
    clipped = dropped = 0
    for box, cls in zip(annotation["boxes"], annotation["classes"]):
        rel = _to_rel_xyxy(box, annotation["format"], height, width)
        inside = [min(max(v, 0.0), 1.0) for v in rel]
        if not all(math.isfinite(v) for v in rel) or (
            inside[2] <= inside[0] or inside[3] <= inside[1]
        ):
            dropped += 1
            continue
        if inside != rel:
            clipped += 1
        boxes.extend(inside)
        classes.append(cls)
    features_out["objects/boxes"] = boxes
    features_out["objects/classes"] = classes
    stats.update(
        objects=classes,
        boxes_clipped=clipped,
        boxes_dropped=dropped,
        # Counted per value by the export: [images with 0 boxes, with 1, ...].
        images_by_box_count=[len(classes)],
    )
    return features_out, stats


# --- Reading ----------------------------------------------------------------


def check_read_options(info, options):
    labels.refuse_class_label_modes(options, "a detection dataset yields box dicts")
    if options.crop_to_aspect_ratio:
        raise ValueError(
            "`crop_to_aspect_ratio=True` would cut boxes off; detection "
            "datasets resize with `pad_to_aspect_ratio` instead."
        )


# Keras core layers that cannot keep boxes right (checked in Keras 3.15's
# source and on real boxes), and why.
_MISALIGNING_CORE_LAYERS = {
    "CutMix": "has no box transform in Keras (it raises NotImplementedError)",
    "AugMix": "returns the boxes unchanged while its chain shears, translates "
    "and rotates the image",
    "MixUp": "concatenates the boxes and their classes along different axes, "
    "so classes no longer match their boxes",
    "RandomElasticTransform": "has no box transform in Keras (it raises "
    "NotImplementedError)",
}


def check_augmentation(augmentation, options):
    """Refuses layers that would read the boxes in another format (they
    would move them wrongly, silently) or look for their classes under
    another key: Keras's own layers read `labels`, KerasCV's `classes`."""
    from keras_datum import augment

    want, key = options.bounding_box_format, options.bounding_box_class_key
    for step in augmentation.layers:
        family = augment.image_layer_family(step)
        if family is None:
            continue  # A callable gets the dict and owns its boxes.
        named = f"The {augmentation.argument} layer {type(step).__name__} (name={step.name!r})"
        keras_core = family == "keras"
        why = _MISALIGNING_CORE_LAYERS.get(type(step).__name__) if keras_core else None
        if why is not None:
            raise ValueError(
                f"{named} {why}: on a detection dataset it would misalign the "
                "boxes. Leave it out, or use the box-aware layers (RandomFlip, "
                "RandomRotation, RandomTranslation, RandomZoom, RandomCrop, "
                "RandomShear, RandAugment, each with bounding_box_format)."
            )
        layer_format = getattr(step, "bounding_box_format", None)
        if keras_core and layer_format is None:
            raise ValueError(
                f"{named} is one of Keras's preprocessing layers, which need a "
                "bounding_box_format on a detection dataset: make it with "
                f"bounding_box_format={want!r}."
            )
        if layer_format is None:
            continue  # KerasCV's colour layers pass boxes by.
        if layer_format != want:
            raise ValueError(
                f"{named} reads boxes as {layer_format!r}, and this dataset's are "
                f"{want!r}: it would move them to the wrong place. Make it with "
                f"bounding_box_format={want!r}."
            )
        needs = "labels" if keras_core else "classes"
        if key != needs:
            raise ValueError(
                f"{named} reads the classes of the boxes under {needs!r}, and this "
                f"dataset puts them under {key!r}. Pass bounding_box_class_key="
                f"{needs!r} to DatumDataset."
            )


def check_split(split, split_info, options, augmentations):
    """Warns when `max_boxes` cuts boxes off the split's images (or off
    the mosaics a KerasCV `Mosaic` makes of four of them)."""
    max_boxes = options.max_boxes
    histogram = split_info.get("images_by_box_count")  # Not in older caches.
    if not max_boxes or not histogram:
        return
    most = max(k for k, n in enumerate(histogram) if n) if any(histogram) else 0
    batch_augment = augmentations[1]
    mosaic = batch_augment is not None and any(
        type(step).__name__ == "Mosaic" for step in batch_augment.steps
    )
    if mosaic and 4 * most > max_boxes:
        notices.warn(
            f"max_boxes={max_boxes} cuts boxes off the mosaics: Mosaic puts the "
            f"boxes of 4 images in one, up to {4 * most} in the {split} split, and "
            f"only the first {max_boxes} are kept (the other objects are left "
            f"unlabelled, as background). Pass max_boxes={4 * most} or more, or "
            "None for ragged batches."
        )
    elif most > max_boxes:
        cut = sum(n for k, n in enumerate(histogram) if k > max_boxes)
        notices.warn(
            f"max_boxes={max_boxes} cuts boxes off {cut} of the {split} split's "
            f"{split_info['num_examples']} images, which have up to {most}: only the "
            f"first {max_boxes} of each are kept. Pass max_boxes={most} or more, or "
            "None for ragged batches."
        )


def decode(parsed, info, options, seed=None):
    """Image resized to `image_size` and its boxes, moved with the pixels;
    with a crop `seed`, the image's window (see `images.decode_window`)
    and the boxes moved into it, those left outside dropped."""
    boxes = tf.reshape(parsed["objects/boxes"], [-1, 4])
    classes = tf.cast(parsed["objects/classes"], tf.float32)
    if options.random_resized_crop is not None and seed is not None:
        image, window = images.decode_window(parsed, options, seed)
        boxes, classes = crop.moved_boxes(
            boxes, classes, parsed["image/height"], parsed["image/width"], window
        )
        options = images.window_options(options)
    else:
        image = images.decode(parsed, options)
    if options.pad_to_aspect_ratio:
        shape = tf.shape(image)
        target_height, target_width = options.image_size
        scaled_h, scaled_w, top, left = images.pad_geometry(
            shape[0], shape[1], options.image_size
        )
        scale = tf.stack([scaled_w / target_width, scaled_h / target_height] * 2)
        offset = tf.stack([left / target_width, top / target_height] * 2)
        boxes = boxes * scale + offset
    resized = images.resize(image, options)
    from keras_cv import bounding_box

    boxes = bounding_box.convert_format(
        boxes,
        source="rel_xyxy",
        target=options.bounding_box_format,
        image_shape=(*options.image_size, 3),
    )
    key = options.bounding_box_class_key
    return {"images": resized, "bounding_boxes": {"boxes": boxes, key: classes}}


def _pad(values, max_boxes, tail, batched=False):
    """Boxes (`tail` [4]) or classes (`tail` []), ragged or dense, cut or
    padded with -1 to `max_boxes` along the box axis (axis 1 of a batch)."""
    if isinstance(values, tf.RaggedTensor):
        values = values.to_tensor(default_value=-1.0)
    lead = [[0, 0]] if batched else []
    values = values[:, :max_boxes] if batched else values[:max_boxes]
    padding = lead + [[0, max_boxes - tf.shape(values)[len(lead)]]] + [[0, 0]] * len(tail)
    shape = [None] * len(lead) + [max_boxes] + tail
    return tf.ensure_shape(tf.pad(values, padding, constant_values=-1.0), shape)


def batch(dataset, batch_size, options):
    """Pads to `max_boxes` (after per-example augmentation, which may change
    the box count), then batches: dense with `max_boxes`, else ragged."""
    max_boxes = options.max_boxes
    if max_boxes:
        key = options.bounding_box_class_key

        def pad(inputs):
            boxes = inputs["bounding_boxes"]
            padded = {
                "boxes": _pad(boxes["boxes"], max_boxes, [4]),
                key: _pad(boxes[key], max_boxes, []),
            }
            return dict(inputs, bounding_boxes=padded)

        dataset = dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE)
        if batch_size is None:
            return dataset
        return dataset.batch(batch_size, num_parallel_calls=tf.data.AUTOTUNE)
    if batch_size is None:
        return dataset
    return dataset.ragged_batch(batch_size)


def after_batch_augment(inputs, options):
    """A batch's boxes back in the form `max_boxes` asks for, after a batch
    augmentation: KerasCV's `Mosaic` and `RandomFlip` hand back ragged boxes
    (Mosaic more of them), Keras's `RandomFlip` dense ones whose padding rows
    it moved too. Padding is a box of -1 with class -1 (`max_boxes=N`), or
    left out (ragged, `max_boxes=None`)."""
    max_boxes = options.max_boxes
    key = options.bounding_box_class_key
    boxes, classes = inputs["bounding_boxes"]["boxes"], inputs["bounding_boxes"][key]
    if not max_boxes:
        if not isinstance(classes, tf.RaggedTensor):
            keep = classes != -1.0
            boxes = tf.ragged.boolean_mask(boxes, keep)
            classes = tf.ragged.boolean_mask(classes, keep)
        return dict(inputs, bounding_boxes={"boxes": boxes, key: classes})
    classes = _pad(classes, max_boxes, [], batched=True)
    boxes = tf.where((classes == -1.0)[..., None], -1.0, _pad(boxes, max_boxes, [4], batched=True))
    return dict(inputs, bounding_boxes={"boxes": boxes, key: classes})


def to_keras(inputs):
    return inputs["images"], inputs["bounding_boxes"]


class Detection(base.Problem):
    """The detection problem's hooks: this module's functions."""

    NAME = NAME
    OPTIONS = base.IMAGE_OPTIONS + ("max_boxes", "bounding_box_format", "bounding_box_class_key")
    # Boxes keep their shape.
    PAD_TO_ASPECT_RATIO = True
    batches_itself = True
    fixed_examples = False
    find_layout = staticmethod(detection_layouts.find_layout)
    features = staticmethod(features)
    encode = staticmethod(encode)
    decode = staticmethod(decode)
    to_keras = staticmethod(to_keras)
    check_read_options = staticmethod(check_read_options)
    check_augmentation = staticmethod(check_augmentation)
    check_split = staticmethod(check_split)
    batch = staticmethod(batch)
    after_batch_augment = staticmethod(after_batch_augment)


PROBLEM = Detection()
