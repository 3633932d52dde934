"""Small VOC, COCO and YOLO folders drawn at run time: bright boxes on black."""

import json
import os

import numpy as np
from PIL import Image

CLASS_NAMES = ["cat", "dog"]
HEIGHT, WIDTH = 40, 60


def draw_items(count=6, seed=0, size=(HEIGHT, WIDTH), boxes_in=lambda index: index % 3,
               box_sides=((8, 20), (6, 15))):
    """[(stem, boxes as absolute xyxy, classes, pixels)] with distinct boxes.

    Args:
        size: each image's (height, width).
        boxes_in: the number of boxes of the index-th image (by default 0, 1
            or 2 objects: empty images too).
        box_sides: the ranges of the boxes' widths and heights.
    """
    height, width = size
    rng = np.random.default_rng(seed)
    items = []
    for index in range(count):
        pixels = np.zeros((height, width, 3), np.uint8)
        boxes, classes = [], []
        for _ in range(boxes_in(index)):
            x1, y1 = rng.integers(0, width - 20), rng.integers(0, height - 15)
            w, h = rng.integers(*box_sides[0]), rng.integers(*box_sides[1])
            boxes.append([int(x1), int(y1), int(x1 + w), int(y1 + h)])
            classes.append(int(rng.integers(0, 2)))
            pixels[y1 : y1 + h, x1 : x1 + w] = 255
        items.append((f"img{index:03d}", boxes, classes, pixels))
    return items


def as_xyxy(boxes, fmt, image_size):
    """Boxes in KerasCV format `fmt` as absolute xyxy, for comparisons."""
    import keras_cv

    return keras_cv.bounding_box.convert_format(
        np.asarray(boxes, np.float32).reshape(-1, 4), source=fmt, target="xyxy",
        image_shape=(*image_size, 3),
    ).numpy()


def write_voc(root, items, split_lists=None, class_file=True):
    os.makedirs(os.path.join(root, "JPEGImages"))
    os.makedirs(os.path.join(root, "Annotations"))
    for stem, boxes, classes, pixels in items:
        Image.fromarray(pixels).save(os.path.join(root, "JPEGImages", stem + ".png"))
        objects = "".join(
            f"<object><name>{CLASS_NAMES[c]}</name><difficult>0</difficult><bndbox>"
            f"<xmin>{b[0]}</xmin><ymin>{b[1]}</ymin><xmax>{b[2]}</xmax><ymax>{b[3]}</ymax>"
            "</bndbox></object>"
            for b, c in zip(boxes, classes)
        )
        with open(os.path.join(root, "Annotations", stem + ".xml"), "w") as f:
            f.write(
                f"<annotation><filename>{stem}.png</filename><size><width>{WIDTH}</width>"
                f"<height>{HEIGHT}</height><depth>3</depth></size>{objects}</annotation>"
            )
    if split_lists:
        os.makedirs(os.path.join(root, "ImageSets", "Main"))
        for split, stems in split_lists.items():
            with open(os.path.join(root, "ImageSets", "Main", split + ".txt"), "w") as f:
                f.write("\n".join(stems) + "\n")
    if class_file:
        with open(os.path.join(root, "labels.txt"), "w") as f:
            f.write("\n".join(CLASS_NAMES) + "\n")
    return str(root)


def write_coco(root, items_by_split):
    os.makedirs(os.path.join(root, "annotations"))
    for split, items in items_by_split.items():
        os.makedirs(os.path.join(root, split))
        images, annotations = [], []
        for image_id, (stem, boxes, classes, pixels) in enumerate(items, start=1):
            Image.fromarray(pixels).save(os.path.join(root, split, stem + ".png"))
            images.append({"id": image_id, "file_name": stem + ".png", "width": WIDTH, "height": HEIGHT})
            for b, c in zip(boxes, classes):
                annotations.append({
                    "id": len(annotations) + 1, "image_id": image_id,
                    # Category ids 3 and 7: not contiguous, as in COCO itself.
                    "category_id": (3, 7)[c], "iscrowd": 0,
                    "bbox": [b[0], b[1], b[2] - b[0], b[3] - b[1]],
                })
        data = {
            "images": images,
            "annotations": annotations,
            "categories": [{"id": 7, "name": "dog"}, {"id": 3, "name": "cat"}],
        }
        with open(os.path.join(root, "annotations", f"instances_{split}.json"), "w") as f:
            json.dump(data, f)
    return str(root)


def write_yolo(root, items_by_split, names_file="data.yaml", split_first=False):
    """Ultralytics's `images/<split>/` and `labels/<split>/`, or with
    `split_first` Roboflow's `<split>/images/` and `<split>/labels/`."""
    for split, items in items_by_split.items():
        image_dir, label_dir = (
            (os.path.join(root, split, "images"), os.path.join(root, split, "labels"))
            if split_first
            else (os.path.join(root, "images", split), os.path.join(root, "labels", split))
        )
        os.makedirs(image_dir)
        os.makedirs(label_dir)
        for stem, boxes, classes, pixels in items:
            Image.fromarray(pixels).save(os.path.join(image_dir, stem + ".png"))
            if not boxes:
                continue  # An image without a label file has no objects.
            with open(os.path.join(label_dir, stem + ".txt"), "w") as f:
                for b, c in zip(boxes, classes):
                    cx, cy = (b[0] + b[2]) / 2 / WIDTH, (b[1] + b[3]) / 2 / HEIGHT
                    w, h = (b[2] - b[0]) / WIDTH, (b[3] - b[1]) / HEIGHT
                    f.write(f"{c} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}\n")
    if names_file == "data.yaml":
        with open(os.path.join(root, "data.yaml"), "w") as f:
            f.write("path: .\ntrain: images/train\nnames:\n  0: cat\n  1: dog\n")
    else:
        with open(os.path.join(root, "classes.txt"), "w") as f:
            f.write("cat\ndog\n")
    return str(root)
