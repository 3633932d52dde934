"""Object detection's source layouts: Pascal VOC, COCO and YOLO, tried in this order.

```
Pascal VOC                     COCO                                YOLO
root/                          root/                               root/
  JPEGImages/  0001.jpg          annotations/                        data.yaml (names) or classes.txt
  Annotations/ 0001.xml            instances_train.json              images/train/ 0001.jpg
  ImageSets/Main/train.txt         instances_val.json                labels/train/ 0001.txt
  (or ImageSets/train.txt)       train/ (or images/train/,           images/val/ ...
  classes.names / labels.txt       or train2017/) ...                labels/val/ ...
  (optional)                                                         (or Roboflow's train/images/,
                                                                     train/labels/, valid/images/ ...)
```

Each finder returns the `Layout` of `root`, or None when `root` is not in its
layout. A record's annotation holds the boxes as the source gives them:
absolute `xyxy` pixels (VOC, COCO) or relative centre boxes,
`rel_center_xywh` (YOLO); `detection.encode` turns them into the stored
`rel_xyxy`. COCO `iscrowd` regions are not objects and are skipped.
"""

import os
import re
from xml.etree import ElementTree

from keras_datum import notices
from keras_datum import sources
from keras_datum import storage
from keras_datum.sources import ExampleRecord
from keras_datum.sources import Layout

# The problem these layouts are for (`detection.NAME`).
NAME = "detection"
SPLITS = sources.SPLIT_NAMES


def find_layout(root, follow_links=False):
    """The `Layout` of the first layout `root` is in (VOC, COCO, YOLO), or None."""
    for finder in (_find_voc, _find_coco, _find_yolo):
        layout = finder(root, follow_links)
        if layout is not None:
            return layout
    return None


def _class_index(class_names, name, where):
    try:
        return class_names.index(name)
    except ValueError:
        raise ValueError(
            f"{where}: unknown class {name!r}; known classes: {class_names}"
        ) from None


def _detection_layout(name, splits, class_names, extra_files):
    return Layout(
        name=name,
        problem=NAME,
        splits=splits,
        info={
            "class_names": list(class_names),
            "label_spec": {"type": "detection", "num_classes": len(class_names)},
        },
        extra_files=extra_files,
    )


def _record(root, image_path, boxes, classes, box_format):
    """`boxes`: absolute `xyxy` pixels, or `rel_xywh` centre boxes for YOLO."""
    return ExampleRecord(
        path=image_path,
        relpath=sources.relative_path(image_path, root),
        annotation={"boxes": boxes, "classes": classes, "format": box_format},
    )


# --- Pascal VOC ---------------------------------------------------------------


def parse_voc_xml(path):
    """Returns (image file name or None, [(class name, xmin, ymin, xmax, ymax)]).

    Raises:
        ValueError: malformed XML or a box without numbers; names the file.
    """
    try:
        with storage.open(path, "rb") as f:
            tree = ElementTree.parse(f)
    except ElementTree.ParseError as e:
        raise ValueError(f"{path}: malformed XML ({e}).") from None
    root = tree.getroot()
    filename = root.findtext("filename")
    objects = []
    for index, obj in enumerate(root.iter("object")):
        name = (obj.findtext("name") or "").strip()
        box = obj.find("bndbox")
        if not name or box is None:
            raise ValueError(f"{path}: object {index} needs a <name> and a <bndbox>.")
        try:
            coords = [float(box.findtext(k)) for k in ("xmin", "ymin", "xmax", "ymax")]
        except (TypeError, ValueError):
            raise ValueError(
                f"{path}: object {index} ({name!r}) has a <bndbox> without "
                "numeric xmin, ymin, xmax and ymax."
            ) from None
        objects.append((name, *coords))
    return (filename.strip() if filename else None), objects


def _find_voc(root, follow_links):
    image_dir = os.path.join(root, "JPEGImages")
    annotation_dir = os.path.join(root, "Annotations")
    if not (storage.isdir(image_dir) and storage.isdir(annotation_dir)):
        return None
    class_names, class_file = sources.read_class_names(root)
    lists = sources.voc_split_lists(root, "Main")
    extra = [class_file] if class_file else []
    if lists:
        extra.extend(lists.values())
        ids_by_split = sources.read_split_lists(lists)
    else:
        ids_by_split = {
            "train": [
                (os.path.splitext(name)[0], annotation_dir)
                for name in sorted(storage.listdir(annotation_dir))
                if name.endswith(".xml")
            ]
        }
    parsed = {}
    annotation_of = {}  # image path -> the annotation naming it
    for split, ids in ids_by_split.items():
        parsed[split] = []
        for example_id, where in ids:
            xml_path = sources.resolve_inside(annotation_dir, example_id + ".xml", where)
            if not storage.is_any_file(xml_path):
                raise ValueError(f"{where}: no annotation file {xml_path!r}.")
            extra.append(xml_path)
            filename, objects = parse_voc_xml(xml_path)
            image_name = filename or example_id + ".jpg"
            image_path = sources.resolve_inside(image_dir, image_name, xml_path)
            if image_path in annotation_of:
                raise ValueError(
                    f"{annotation_of[image_path]!r} and {xml_path!r} both annotate "
                    f"{image_path!r}. Merge them into one annotation."
                )
            annotation_of[image_path] = xml_path
            parsed[split].append((xml_path, image_path, objects))
    if class_names is None:
        class_names = sorted({o[0] for rows in parsed.values() for _, _, objs in rows for o in objs})
    splits = {}
    for split, rows in parsed.items():
        splits[split] = [
            _record(
                root,
                image_path,
                [list(o[1:]) for o in objects],
                [_class_index(class_names, o[0], xml_path) for o in objects],
                "xyxy",
            )
            for xml_path, image_path, objects in rows
        ]
    if not any(splits.values()):
        raise ValueError(f"The VOC folder {root!r} lists no annotations.")
    sources.require_train(splits, root, "a train.txt split list")
    return _detection_layout("voc", splits, class_names, extra)


# --- COCO -------------------------------------------------------------------


def parse_coco_json(path):
    """Returns (images by id, annotations, categories) from a COCO json file.

    Raises:
        ValueError: malformed JSON or missing fields; names the file and item.
    """
    data = sources.read_json_object(path, "a JSON object with 'images'")

    def items(key, required):
        value = data.get(key, [])
        if not isinstance(value, list):
            raise ValueError(f"{path}: '{key}' must be a list.")
        for index, item in enumerate(value):
            if not isinstance(item, dict) or any(k not in item for k in required):
                raise ValueError(f"{path}: {key}[{index}] needs the fields {list(required)}.")
        return value

    image_items = items("images", ("id", "file_name"))
    annotations = items("annotations", ("image_id", "category_id", "bbox"))
    categories = items("categories", ("id", "name"))
    for key, entries, fields in (
        ("images", image_items, ("id",)),
        ("annotations", annotations, ("image_id", "category_id")),
        ("categories", categories, ("id",)),
    ):
        for index, item in enumerate(entries):
            for field in fields:
                value = item[field]
                if isinstance(value, bool) or not isinstance(value, (int, str)):
                    raise ValueError(
                        f"{path}: {key}[{index}].{field} must be an integer or a "
                        f"string. Received: {value!r}"
                    )
    annotations = [
        dict(ann, bbox=_coco_box(ann["bbox"], f"{path}: annotations[{index}].bbox"))
        for index, ann in enumerate(annotations)
    ]
    images_by_id, index_of_name = {}, {}
    for index, image in enumerate(image_items):
        if not isinstance(image["file_name"], str):
            raise ValueError(f"{path}: images[{index}].file_name must be a string.")
        for key, seen in (("id", images_by_id), ("file_name", index_of_name)):
            value = image[key]
            if value in seen:
                first = seen[value] if key == "file_name" else image_items.index(seen[value])
                raise ValueError(
                    f"{path}: images[{first}] and images[{index}] have the same "
                    f"{key} {value!r}; each image must be listed once."
                )
        images_by_id[image["id"]] = image
        index_of_name[image["file_name"]] = index
    return images_by_id, annotations, categories


def _coco_box(bbox, where):
    """A COCO `bbox` as 4 floats (a box of inf or nan is dropped at export,
    as a box without area is).

    Raises:
        ValueError: not 4 numbers, or an integer too large for a float (a
            400-digit one); names `where`.
    """
    if (
        not isinstance(bbox, list)
        or len(bbox) != 4
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in bbox)
    ):
        raise ValueError(f"{where} must be 4 numbers [x, y, w, h].")
    try:
        return [float(v) for v in bbox]
    except OverflowError:
        raise ValueError(
            f"{where} holds an integer too large for a number of pixels. "
            f"Received: {str(bbox)[:80]}"
        ) from None


def _coco_split(name, splits=SPLITS):
    """The split a COCO file or folder name gives, with or without a year
    (`val2017`); None for none."""
    return splits.get(re.sub(r"\d+$", "", name))


def _find_coco(root, follow_links):
    annotation_dir = os.path.join(root, "annotations")
    if not storage.isdir(annotation_dir):
        return None
    files = {}
    for name in sorted(storage.listdir(annotation_dir)):
        match = re.fullmatch(r"instances_(.+)\.json", name)
        if match and _coco_split(match.group(1)):
            files[match.group(1)] = os.path.join(annotation_dir, name)
    if not files:
        return None
    parsed, class_names, index_of = _read_coco_files(files)
    splits = {}
    for split_name, (path, images_by_id, annotations) in parsed.items():
        records = _coco_records(root, split_name, path, images_by_id, annotations, index_of)
        split = _coco_split(split_name)
        if split in splits:
            raise ValueError(f"{root!r} has two COCO annotation files for split {split!r}.")
        splits[split] = records
    sources.require_train(splits, root, "annotations/instances_train.json")
    return _detection_layout("coco", splits, class_names, list(files.values()))


def _read_coco_files(files):
    """Parses the COCO files `{split name: path}` and checks that their
    categories agree.

    Returns:
        `{split name: (path, images by id, annotations)}`, the class names
        (in the order of the sorted category ids) and `{category id: class
        index}`.

    Raises:
        ValueError: one category id named differently in two files, two
            ids of one name, or ids that mix integers and strings; names
            the files and entries.
    """
    parsed, categories, named_in = {}, {}, {}
    for split_name, path in files.items():
        images_by_id, annotations, cats = parse_coco_json(path)
        for index, cat in enumerate(cats):
            where = f"{path}: categories[{index}]"
            name = categories.setdefault(cat["id"], cat["name"])
            if name != cat["name"]:
                raise ValueError(
                    f"{where} names category id {cat['id']!r} {cat['name']!r}, but "
                    f"{named_in[cat['id']]} names it {name!r}. One id is one class "
                    "in every annotation file."
                )
            named_in.setdefault(cat["id"], where)
        parsed[split_name] = (path, images_by_id, annotations)
    by_name = {}
    for cat_id, name in categories.items():
        if name in by_name:
            raise ValueError(
                f"{named_in[by_name[name]]} and {named_in[cat_id]} both name a category "
                f"{name!r} (ids {by_name[name]!r} and {cat_id!r}); class names must differ."
            )
        by_name[name] = cat_id
    if len({type(i) for i in categories}) > 1:
        raise ValueError(
            f"{sorted(files.values())}: category ids mix integers and strings "
            f"({sorted(map(repr, categories))[:6]}); use one kind, so that "
            "they sort into class indices one way."
        )
    ids = sorted(categories)
    class_names = [str(categories[i]) for i in ids]
    index_of = {cat_id: index for index, cat_id in enumerate(ids)}
    return parsed, class_names, index_of


def _coco_records(root, split_name, path, images_by_id, annotations, index_of):
    """The records of one COCO file (`path`, of the split `split_name`),
    sorted by file name; `iscrowd` regions are left out.

    Raises:
        ValueError: no image folder for the split, or an annotation naming
            an unknown image or category; names the file and entry.
    """
    image_dir = next(
        (
            d
            for d in (
                os.path.join(root, split_name),
                os.path.join(root, "images", split_name),
                os.path.join(root, _coco_split(split_name)),
                os.path.join(root, "images", _coco_split(split_name)),
            )
            if storage.isdir(d)
        ),
        None,
    )
    if image_dir is None:
        raise ValueError(f"{path}: no image folder {split_name!r} or images/{split_name!r}.")
    objects = {image_id: [] for image_id in images_by_id}
    for index, ann in enumerate(annotations):
        if ann.get("iscrowd"):
            continue
        if ann["image_id"] not in objects:
            raise ValueError(f"{path}: annotations[{index}] names unknown image_id {ann['image_id']!r}.")
        if ann["category_id"] not in index_of:
            raise ValueError(
                f"{path}: annotations[{index}] has unknown category_id {ann['category_id']!r}."
            )
        x, y, w, h = ann["bbox"]
        objects[ann["image_id"]].append(([x, y, x + w, y + h], index_of[ann["category_id"]]))
    records = []
    for image_id in sorted(images_by_id, key=lambda i: str(images_by_id[i]["file_name"])):
        image_path = sources.resolve_inside(image_dir, images_by_id[image_id]["file_name"], path)
        boxes = [b for b, _ in objects[image_id]]
        classes = [c for _, c in objects[image_id]]
        records.append(_record(root, image_path, boxes, classes, "xyxy"))
    return records


# --- YOLO -------------------------------------------------------------------


def _yolo_names_from_yaml(path):
    import yaml

    try:
        data = yaml.safe_load(sources.read_text(path))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: malformed YAML ({e}).") from None
    names = data.get("names") if isinstance(data, dict) else None
    if isinstance(names, dict):
        if sorted(names) != list(range(len(names))):
            raise ValueError(f"{path}: 'names' must map 0..N-1 to class names.")
        names = [names[i] for i in range(len(names))]
    if not isinstance(names, list) or not names:
        raise ValueError(f"{path}: needs a 'names' list of class names.")
    return [str(n) for n in names]


def parse_yolo_labels(path, num_classes):
    """Returns ([[cx, cy, w, h] relative], [class]) from one YOLO label file.

    Raises:
        ValueError: a line that is not `class cx cy w h`; names file and line.
    """
    boxes, classes = [], []
    for number, line in enumerate(sources.read_lines(path), start=1):
        parts = line.split()
        if not parts:
            continue
        try:
            if len(parts) != 5:
                raise ValueError
            cls = int(parts[0])
            values = [float(v) for v in parts[1:]]
        except ValueError:
            raise ValueError(
                f"{path}:{number}: expected 'class cx cy w h', found {line.strip()!r}."
            ) from None
        if not 0 <= cls < num_classes:
            raise ValueError(
                f"{path}:{number}: class {cls} is outside 0..{num_classes - 1}."
            )
        boxes.append(values)
        classes.append(cls)
    return boxes, classes


# Ultralytics's and Roboflow's split folder names: COCO's (with or without a
# year: `train2017/`), and Roboflow's `valid/`.
_YOLO_SPLITS = {**SPLITS, "valid": "val"}


def _yolo_split(name):
    return _coco_split(name, _YOLO_SPLITS)


def _yolo_folders(root):
    """{split: (images folder, labels folder)} of a YOLO source, or None
    when `root` is not one: Ultralytics's `images/<split>/` beside
    `labels/<split>/`, or Roboflow's `<split>/images/` beside
    `<split>/labels/` (with a data.yaml or classes.txt at the top).

    Raises:
        ValueError: a folder that would be left out (not a split's), or
            two folders of one split.
    """
    images_root, labels_root = os.path.join(root, "images"), os.path.join(root, "labels")
    if storage.isdir(images_root) and storage.isdir(labels_root):
        names = sources.visible_subdirs(images_root)
        where, folders = images_root, sources.split_folders(names, images_root, _yolo_split)
        pairs = {s: (os.path.join(images_root, f), os.path.join(labels_root, f)) for s, f in folders.items()}
    elif any(storage.is_any_file(os.path.join(root, n)) for n in ("data.yaml", "classes.txt")):
        # A split with only one of the two is named by `_find_yolo`.
        names = [
            name for name in sources.visible_subdirs(root)
            if storage.isdir(os.path.join(root, name, "images"))
            or storage.isdir(os.path.join(root, name, "labels"))
        ]
        if not names:
            return None
        where, folders = root, sources.split_folders(names, root, _yolo_split)
        pairs = {
            s: (os.path.join(root, f, "images"), os.path.join(root, f, "labels"))
            for s, f in folders.items()
        }
    else:
        return None
    others = sorted(set(names) - set(folders.values()))
    if others:
        raise ValueError(
            f"The YOLO folder {where!r} holds {others[0]!r}/, which is not a split "
            "folder (train/, val/, valid/ or validation/, test/, with or without a "
            "year as train2017/): its images would be left out. Rename or move it."
        )
    return pairs


def _warn_labels_without_images(label_dir, stems):
    """Label files no image of the split has: their objects are left out,
    which a deleted image or a misnamed one would also cause."""
    orphans = sorted(
        name for name in storage.listdir(label_dir)
        if name.endswith(".txt") and name != "classes.txt"  # LabelImg writes one there.
        and name[: -len(".txt")] not in stems
    )
    if orphans:
        notices.warn(
            f"{len(orphans)} label files in {label_dir!r} have no image of their "
            f"name in the split (such as {orphans[0]!r}): their objects are left out."
        )


def _find_yolo(root, follow_links):
    folders = _yolo_folders(root)
    if folders is None:
        return None
    yaml_path = os.path.join(root, "data.yaml")
    if storage.is_any_file(yaml_path):
        class_names, class_file = _yolo_names_from_yaml(yaml_path), yaml_path
    else:
        class_names, class_file = sources.read_class_names(root)
    if class_names is None:
        raise ValueError(
            f"The YOLO folder {root!r} needs class names in data.yaml or classes.txt."
        )
    extra = [class_file]
    splits = {}
    for split, (image_dir, label_dir) in folders.items():
        for present, missing in ((image_dir, label_dir), (label_dir, image_dir)):
            if not storage.isdir(missing):
                raise ValueError(
                    f"The YOLO folder {root!r} has {present!r} but no {missing!r}: "
                    "each split needs its images folder and its labels folder."
                )
        records = []
        paths = sources.iter_image_files(image_dir, follow_links)
        stems = sources.unique_stems(paths, image_dir)
        _warn_labels_without_images(label_dir, stems)
        for stem, image_path in stems.items():
            label_path = os.path.join(label_dir, stem + ".txt")
            boxes, classes = [], []
            # Fingerprinted even when missing, so that adding one re-exports.
            extra.append(label_path)
            if storage.is_any_file(label_path):
                boxes, classes = parse_yolo_labels(label_path, len(class_names))
            records.append(_record(root, image_path, boxes, classes, "rel_center_xywh"))
        splits[split] = records
    sources.refuse_files_in_two_splits(
        {split: [r.path for r in records] for split, records in splits.items()}, follow_links
    )
    if "train" not in splits or not splits["train"]:
        raise ValueError(
            f"The YOLO folder {root!r} has no training images (images/train/ or "
            "train/images/)."
        )
    return _detection_layout("yolo", splits, class_names, extra)
