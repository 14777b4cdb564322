#!/usr/bin/env python3
"""An ordinary TensorFlow program (tensorflow[and-cuda] from PyPI). It knows nothing about
gpucap or the fake GPU: scripts/dev/frameworks.sh runs it on the fake GPU, with and without
the shim, and reads its output.

Usage: tf_client.py [STEP...] where each STEP is
  info           the GPUs TensorFlow lists and each one's details (name, compute capability)
  growth         tf.config.experimental.set_memory_growth(gpu, True) for each GPU (before
                 any step that starts the devices)
  vlimit:<MiB>   one logical device of that many MiB on GPU 0
                 (set_logical_device_configuration; before the devices start)
  devices        starts the devices; the memory limit TensorFlow gave each GPU device
                 (device_lib.list_local_devices with the eager context's configuration;
                 before any allocation, as the limit is computed from the free memory)
  meminfo        tf.config.experimental.get_memory_info('GPU:0')
  fill:<MiB>     tf.zeros of that many MiB on GPU 0 until TensorFlow refuses
                 (tf.errors.ResourceExhaustedError), at most 64; the tensors are kept
  free           drop the tensors
  copy:<MiB>     that many MiB of random bytes to GPU 0 and back (.numpy()); compares
  kernel         an elementwise op on GPU 0 (launched on the fake: not run)
  fit:<batch>[:xla]
                 one epoch of Keras's fit of a small convolutional net on 4 batches of random
                 32x32 images with soft placement (Keras puts its input pipeline on the CPU);
                 the weights must live on GPU 0. jit_compile=False (TensorFlow's kernels,
                 cuDNN, cuBLAS), or with :xla Keras's default ("auto": XLA on a GPU, whose
                 command buffers are CUDA graphs)

Output, one fact per line:
  tf <version> cuda=<build's CUDA version> cudnn=<build's cuDNN version>
  gpus <n>
  gpu <i> name=<name> cc=<major>.<minor>
  device <name> memory_limit=<bytes>
  memory_info current=<bytes> peak=<bytes>
  alloc <MiB> ok | alloc <MiB> err <exception class>
  freed
  copy <MiB> ok <device> | copy <MiB> mismatch <device>
  kernel ok <device>
  fit <batch> ok <device of the first weight> | fit <batch> err <exception class>
  done
"""

import sys

import numpy as np
import tensorflow as tf

MIB = 1 << 20
held = []


def step(s):
    gpus = tf.config.list_physical_devices("GPU")
    if s == "info":
        print(f"gpus {len(gpus)}", flush=True)
        for i, g in enumerate(gpus):
            d = tf.config.experimental.get_device_details(g)
            cc = d.get("compute_capability", (-1, -1))
            name = d.get("device_name", "?").replace(" ", "_")
            print(f"gpu {i} name={name} cc={cc[0]}.{cc[1]}", flush=True)
    elif s == "growth":
        for g in gpus:
            tf.config.experimental.set_memory_growth(g, True)
    elif s.startswith("vlimit:"):
        mib = int(s.split(":")[1])
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=mib)])
    elif s == "devices":
        from tensorflow.python.client import device_lib
        from tensorflow.python.eager import context

        # The eager context's devices first (their allocators are made once per GPU, with
        # its options: growth, logical devices), then the same configuration's limits.
        tf.config.list_logical_devices("GPU")
        for d in device_lib.list_local_devices(context.context().config):
            if d.device_type == "GPU":
                print(f"device {d.name} memory_limit={d.memory_limit}", flush=True)
    elif s == "meminfo":
        m = tf.config.experimental.get_memory_info("GPU:0")
        print(f"memory_info current={m['current']} peak={m['peak']}", flush=True)
    elif s.startswith("fill:"):
        mib = int(s.split(":")[1])
        for _ in range(64):
            try:
                with tf.device("/GPU:0"):
                    t = tf.zeros((mib * MIB,), dtype=tf.uint8)
                if not t.device.endswith("GPU:0"):
                    print(f"alloc {mib} err on {t.device}", flush=True)
                    break
                held.append(t)
                print(f"alloc {mib} ok", flush=True)
            except tf.errors.ResourceExhaustedError as e:
                print(f"alloc {mib} err {type(e).__name__}", flush=True)
                break
    elif s == "free":
        held.clear()
        print("freed", flush=True)
    elif s.startswith("copy:"):
        mib = int(s.split(":")[1])
        host = np.random.default_rng(mib).integers(0, 256, size=mib * MIB, dtype=np.uint8)
        with tf.device("/GPU:0"):
            dev = tf.constant(host)
        back = dev.numpy()
        same = "ok" if np.array_equal(back, host) else "mismatch"
        print(f"copy {mib} {same} {dev.device.split('/')[-1]}", flush=True)
        del dev
    elif s == "kernel":
        with tf.device("/GPU:0"):
            a = tf.ones((1024,))
            b = a * 2 + 1  # launched; the fake does not run it
        print(f"kernel ok {b.device.split('/')[-1]}", flush=True)
    elif s.startswith("fit:"):
        import keras

        batch = int(s.split(":")[1])
        jit = "auto" if s.endswith(":xla") else False
        tf.config.set_soft_device_placement(True)
        try:
            with tf.device("/GPU:0"):
                m = keras.Sequential([
                    keras.Input((32, 32, 3)),
                    keras.layers.Conv2D(32, 3, activation="relu"),
                    keras.layers.Conv2D(32, 3, activation="relu"),
                    keras.layers.GlobalAveragePooling2D(),
                    keras.layers.Dense(10),
                ])
                m.compile(optimizer="adam", jit_compile=jit,
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
                rng = np.random.default_rng(batch)
                x = rng.random((4 * batch, 32, 32, 3), dtype=np.float32)
                y = rng.integers(0, 10, 4 * batch)
                m.fit(x, y, batch_size=batch, epochs=1, verbose=0)
            where = m.weights[0].value.device.split("/")[-1]
            print(f"fit {batch} ok {where}", flush=True)
        except tf.errors.OpError as e:
            print(f"fit {batch} err {type(e).__name__}", flush=True)
            print(str(e)[:2000], file=sys.stderr)
        finally:
            tf.config.set_soft_device_placement(False)
    else:
        print(f"bad step {s!r}", file=sys.stderr)
        sys.exit(2)


def main():
    # An op placed on a GPU that TensorFlow did not register fails instead of running on
    # the CPU.
    tf.config.set_soft_device_placement(False)
    b = tf.sysconfig.get_build_info()
    print(f"tf {tf.__version__} cuda={b.get('cuda_version')} cudnn={b.get('cudnn_version')}",
          flush=True)
    for s in sys.argv[1:]:
        step(s)
    print("done", flush=True)


if __name__ == "__main__":
    main()
