"""Must NOT type-check: wrong argument types are caught through ParamSpec, and an operator's
right-hand side must be a pool."""

import skyward as sky


@sky.compute
def loss(lr: float) -> float:
    return lr


loss("not a float")
loss(0.1) >> 3
