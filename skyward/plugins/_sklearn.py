"""``sky.plugins.sklearn``: scikit-learn on every node, its parallel work spread over the pool.

scikit-learn parallelises through joblib (``n_jobs=``), so this plugin is the joblib plugin
with scikit-learn added to the image:

* ``transform`` (client): appends ``scikit-learn`` and ``joblib`` to the image's pip packages.
* ``around_client`` (client, for the pool's lifetime): the joblib plugin's hook
  (:func:`skyward.plugins._joblib.use_pool`): inside the pool, ``GridSearchCV(n_jobs=-1)``,
  ``cross_validate(n_jobs=-1)``, ``RandomForestClassifier(n_jobs=-1)`` and every other
  joblib-based call run their batches as tasks on every node's slots.

Neither scikit-learn nor joblib is imported by this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from skyward.plugins._base import PoolInfo, Plugin
from skyward.plugins._joblib import use_pool

if TYPE_CHECKING:
    from skyward.image import Image

__all__ = ["sklearn"]


def _transform(image: Image, cluster: PoolInfo) -> Image:
    return image.with_pip("scikit-learn", "joblib")


def sklearn() -> Plugin:
    """scikit-learn on every node, and its ``n_jobs`` parallelism running on the pool.

    >>> import skyward as sky
    >>> from sklearn.model_selection import GridSearchCV                     # doctest: +SKIP
    >>> with sky.ComputePool(nodes=2, plugins=[sky.plugins.sklearn()]):       # doctest: +SKIP
    ...     search = GridSearchCV(model, grid, n_jobs=-1).fit(X, y)          # batches on both nodes
    """
    return Plugin("sklearn", transform=_transform, around_client=use_pool)
