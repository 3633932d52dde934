"""Distribution strategy and mixed-precision defaults.

- `strategy="auto"`: `tf.distribute.MirroredStrategy` over all visible GPUs when
  there is more than one, else the default (no-op) strategy. A
  `tf.distribute.Strategy` instance is used as given. It is created on first
  use of `DatumDataset.strategy` or of a split, never at import.
- `mixed_precision="auto"`: `mixed_float16` when a GPU of compute capability
  7.0 or more is visible, `mixed_bfloat16` on TPU, and no change on CPU. It is
  applied when the `DatumDataset` is created, so that a model built afterwards
  (typically in `with ds.strategy.scope():`) picks it up. `"float32"` leaves
  the global Keras policy alone; `"mixed_float16"` and `"mixed_bfloat16"`
  set it.
- Under a mixed policy images leave the pipeline in the policy's compute dtype
  (float16 or bfloat16): half the bytes to copy to the device. Pixel values
  0..255 are exact in both; the only rounding is of resized (fractional)
  values, far below what a network notices. Augmentation still runs in
  float32, before the cast.
"""

import keras
import tensorflow as tf

MIXED_PRECISION_MODES = ("auto", "float32", "mixed_float16", "mixed_bfloat16")


def check_strategy(strategy):
    if strategy == "auto" or isinstance(strategy, tf.distribute.Strategy):
        return strategy
    raise ValueError(
        "`strategy` must be 'auto' or a tf.distribute.Strategy instance. "
        f"Received: strategy={strategy!r}"
    )


def resolve_strategy(strategy):
    if strategy != "auto":
        return strategy
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([d.name for d in gpus])
    return tf.distribute.get_strategy()


def gpu_compute_capabilities():
    """(major, minor) of each visible GPU."""
    capabilities = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        if "compute_capability" in details:
            capabilities.append(tuple(details["compute_capability"]))
    return capabilities


def _has_tpu():
    # Physical devices: listing logical ones would start the TensorFlow
    # runtime, after which users can no longer configure devices or threads.
    return bool(tf.config.list_physical_devices("TPU"))


def auto_policy():
    """The policy `mixed_precision="auto"` picks on this machine, or None."""
    if _has_tpu():
        return "mixed_bfloat16"
    capabilities = gpu_compute_capabilities()
    if capabilities and min(capabilities) >= (7, 0):
        return "mixed_float16"
    return None


def apply_mixed_precision(mode):
    """Sets the global Keras dtype policy for `mode`; returns the policy name in force."""
    policy = auto_policy() if mode == "auto" else mode
    if policy not in (None, "float32"):
        keras.mixed_precision.set_global_policy(policy)
    return keras.mixed_precision.global_policy().name


def input_dtype():
    """The dtype images leave the pipeline in: the policy's compute dtype."""
    return keras.mixed_precision.global_policy().compute_dtype


def num_workers(strategy):
    """Worker machines (processes) in `strategy`'s cluster: 1 without a cluster.

    `MultiWorkerMirroredStrategy` knows its cluster from `TF_CONFIG` through
    its cluster resolver; other strategies have none.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    spec = resolver.cluster_spec().as_dict()
    return max(1, len(spec.get("worker", [])) + len(spec.get("chief", [])))


def auto_shard_policy(strategy, num_files):
    """FILE sharding when every worker can get its own shard files, else DATA."""
    workers = num_workers(strategy)
    if num_files >= workers:
        return tf.data.experimental.AutoShardPolicy.FILE
    return tf.data.experimental.AutoShardPolicy.DATA
