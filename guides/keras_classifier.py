"""Keras 3 on two nodes: each node trains on its shard, the client keeps the better model.

``sky.plugins.keras(backend=...)`` installs Keras on every node and sets ``KERAS_BACKEND``
before anything imports keras (Keras reads it once, at its first import). Here the backend is
JAX, so the pool also gets ``sky.plugins.jax()``.

Each node trains the same small classifier on its own half of the data (``sky.shard``), scores
it on a held-out set, and returns its accuracy with its weights; the client keeps the better
node's weights and scores them again here, with Keras on this machine.

Runs on this machine's CPU (two Local nodes)::

    pip install jax keras
    python guides/keras_classifier.py
"""

import os

import numpy as np

import skyward as sky

os.environ.setdefault("KERAS_BACKEND", "jax")  # (for the check at the end, on this machine)


def make_model():  # type: ignore[no-untyped-def]
    import keras

    model = keras.Sequential([
        keras.Input(shape=(20,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(4, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


@sky.compute
def train(x: np.ndarray, y: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> tuple[int, float, list]:
    import keras

    node = sky.instance_info().node
    xs, ys = sky.shard(x, y, shuffle=True, seed=0)  # this node's half
    keras.utils.set_random_seed(node)
    model = make_model()
    model.fit(xs, ys, epochs=8, batch_size=64, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    print(f"{keras.backend.backend()} backend, {len(xs)} rows, held-out accuracy {accuracy:.3f}")
    return node, float(accuracy), model.get_weights()


def main() -> None:
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=0.35, size=(4, 20))
    labels = rng.integers(0, 4, 3_000)
    points = (centers[labels] + rng.normal(size=(3_000, 20))).astype(np.float32)
    x, y, x_test, y_test = points[:2_500], labels[:2_500], points[2_500:], labels[2_500:]

    plugins = [sky.plugins.jax(), sky.plugins.keras(backend="jax")]
    with sky.ComputePool(nodes=2, plugins=plugins) as pool:
        results = train(x, y, x_test, y_test) @ pool

    node, accuracy, weights = max(results, key=lambda r: r[1])
    model = make_model()
    model.set_weights(weights)
    _, again = model.evaluate(x_test, y_test, verbose=0)
    print(f"best: node {node}, held-out accuracy {accuracy:.3f}; the same weights here: {again:.3f}")
    print(f"the weights score the same here: {abs(again - accuracy) < 1e-6}")


if __name__ == "__main__":
    main()
