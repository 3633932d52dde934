"""Distribution strategy and mixed-precision defaults.

- `strategy="auto"`: `tf.distribute.MirroredStrategy` over all visible GPUs when
  there is more than one, else the default (no-op) strategy. A
  `tf.distribute.Strategy` instance is used as given. It is created on first
  use of `DatumDataset.strategy` or of a split, never at import.
- `mixed_precision="auto"`: `mixed_float16` when every visible GPU has CUDA
  compute capability 7.0 or more, `mixed_bfloat16` on TPU, and no change on
  CPU; on Keras's JAX backend, as JAX sees the devices. It is
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

import re

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


def cuda_capability(text):
    """A CUDA compute capability written `"major.minor"` as `(major, minor)`;
    `None` for anything else (JAX writes a ROCm GPU's as its gfx version)."""
    match = re.fullmatch(r"(\d+)\.(\d+)", str(text))
    return (int(match.group(1)), int(match.group(2))) if match else None


def accelerators():
    """`(platform, devices)` as the Keras backend sees them.

    `platform` is `"tpu"`, `"gpu"` or `"cpu"`; `devices` holds each GPU's
    CUDA compute capability as `(major, minor)` (`None` when it has none,
    such as an AMD GPU). JAX is asked itself when it is the backend: a JAX
    install usually has TensorFlow's CPU build, which sees no GPU at all.
    Other backends are seen through TensorFlow (PyTorch's own view is not
    asked: that backend is not tested here). Physical devices only on
    TensorFlow: listing logical ones would start its runtime, after which
    users can no longer configure devices or threads.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        devices = jax.devices()
        platform = devices[0].platform if devices else "cpu"
        if platform != "gpu":
            return platform, []
        return "gpu", [cuda_capability(getattr(d, "compute_capability", "")) for d in devices]
    if tf.config.list_physical_devices("TPU"):
        return "tpu", []
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return "cpu", []
    capabilities = []
    for gpu in gpus:
        details = tf.config.experimental.get_device_details(gpu)
        capability = details.get("compute_capability")
        capabilities.append(tuple(capability) if capability else None)
    return "gpu", capabilities


def policy_for(platform, capabilities):
    """The policy `mixed_precision="auto"` picks for `accelerators()`' answer,
    or None: float16 needs the tensor cores of CUDA capability 7.0 (Volta)
    on every GPU; a GPU of unknown capability keeps float32."""
    if platform == "tpu":
        return "mixed_bfloat16"
    if platform == "gpu" and capabilities and all(
        c is not None and c >= (7, 0) for c in capabilities
    ):
        return "mixed_float16"
    return None


def auto_policy():
    """The policy `mixed_precision="auto"` picks on this machine, or None."""
    return policy_for(*accelerators())


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
