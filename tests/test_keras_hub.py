"""A KerasHub object detector, built from a config (no preset, no download),
fits on a detection dataset with Keras core box layers: the default
`bounding_box_class_key="labels"` is the key KerasHub's detectors read."""

import keras
import numpy as np
import pytest
from detection_data import draw_items
from detection_data import write_coco
from detection_data import write_voc

from keras_datum import DatumDataset

keras_hub = pytest.importorskip("keras_hub")

SIZE = 64


def _tiny_retinanet(num_classes):
    """A RetinaNet small enough to fit in seconds on a CPU: a two-stage
    ResNet, pyramid levels 3 and 4, anchors near the drawn boxes' size."""
    encoder = keras_hub.models.ResNetBackbone(
        input_conv_filters=[64], input_conv_kernel_sizes=[3],
        stackwise_num_filters=[64, 16, 16], stackwise_num_blocks=[1, 1, 1],
        stackwise_num_strides=[1, 2, 2], block_type="basic_block",
    )
    backbone = keras_hub.models.RetinaNetBackbone(
        image_encoder=encoder, min_level=3, max_level=4, use_p5=False,
    )
    anchors = keras_hub.layers.AnchorGenerator(
        bounding_box_format="xyxy", min_level=3, max_level=4, num_scales=1,
        aspect_ratios=[1.0], anchor_size=1.5,
    )
    from keras_hub.src.models.retinanet.retinanet_label_encoder import RetinaNetLabelEncoder

    model = keras_hub.models.RetinaNetObjectDetector(
        backbone=backbone, num_classes=num_classes, bounding_box_format="xyxy",
        anchor_generator=anchors, pre_logits_num_conv_layers=1,
        label_encoder=RetinaNetLabelEncoder(anchor_generator=anchors, bounding_box_format="xyxy"),
    )
    model.compile(optimizer="adam")
    return model


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["voc", "coco"])
def test_a_keras_hub_detector_fits_on_a_detection_source(tmp_path, kind):
    items = draw_items(8, size=(SIZE, SIZE), boxes_in=lambda i: 1 + i % 2)
    root = (write_voc(tmp_path / "voc", items) if kind == "voc"
            else write_coco(tmp_path / "coco", {"train": items[:6], "val": items[6:]}))
    ds = DatumDataset(root, image_size=(SIZE, SIZE), batch_size=4, max_boxes=4,
                      cache_dir=tmp_path / "cache", verbose=False)
    model = _tiny_retinanet(len(ds.class_names))
    x, y = next(iter(ds.train()))
    # The boxes are where the model looks for them: anchors match objects.
    _, classes = model.label_encoder(images=x, gt_boxes=y["boxes"], gt_classes=y["labels"])
    assert (np.asarray(classes) >= 0).any()
    augment = [keras.layers.RandomFlip("horizontal", bounding_box_format="xyxy"),
               keras.layers.RandomTranslation(0.1, 0.1, bounding_box_format="xyxy")]
    history = model.fit(ds.train(augment=augment), validation_data=ds.val(), epochs=1,
                        shuffle=False, verbose=0)
    for name in ("loss", "val_loss", "cls_logits_loss", "bbox_regression_loss"):
        assert np.isfinite(history.history[name][0]) and history.history[name][0] > 0
