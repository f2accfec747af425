"""Must NOT type-check: wrong argument types are caught through ParamSpec."""

import skyward as sky


@sky.compute
def loss(lr: float) -> float:
    return lr


loss("not a float")
