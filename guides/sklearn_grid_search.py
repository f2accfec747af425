"""A scikit-learn grid search whose cross-validation fits run on every node of a pool.

scikit-learn parallelises through joblib. With ``sky.plugins.sklearn()`` on the pool, joblib's
backend inside the ``with`` block is the pool: ``GridSearchCV(n_jobs=-1)`` sends its fits, in
batches, to all ``nodes * concurrency`` task slots — no change to the scikit-learn code.
Leaving the block puts joblib's previous backend back.

Here the pool is two worker processes on this machine (the Local provider). For machines of
your own or in the cloud, pass ``provider=sky.SSH(...)`` or ``provider=sky.AWS(...)``: the
plugin adds ``scikit-learn`` and ``joblib`` to the image those machines are prepared with.

    python guides/sklearn_grid_search.py
"""

import time
from collections import Counter

from sklearn.datasets import make_classification
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC

import skyward as sky
from skyward import events


def main() -> None:
    X, y = make_classification(n_samples=2_000, n_features=20, n_informative=8, random_state=0)
    X_train, X_test, y_train, y_test = train_test_split(X, y, test_size=0.25, random_state=0)
    grid = {
        "svc__C": [0.1, 1.0, 10.0],
        "svc__gamma": ["scale", 0.01, 0.1],
        "svc__kernel": ["rbf", "sigmoid"],
    }

    # Count where the fits ran: every joblib batch is one task named "joblib" on some node.
    per_node: Counter[int] = Counter()

    def on_event(event: events.Event) -> None:
        if isinstance(event, events.TaskStarted) and event.name == "joblib":
            per_node[event.node] += 1

    with sky.ComputePool(nodes=2, plugins=[sky.plugins.sklearn()], console=False, on_event=on_event):
        started = time.perf_counter()
        search = GridSearchCV(
            make_pipeline(StandardScaler(), SVC()),
            grid,
            cv=3,
            n_jobs=-1,  # every slot of the pool
        )
        search.fit(X_train, y_train)
        seconds = time.perf_counter() - started

    fits = len(search.cv_results_["params"]) * search.n_splits_
    print(f"{fits} fits in {seconds:.1f}s; joblib batches per node: {dict(sorted(per_node.items()))}")
    print(f"best parameters: {search.best_params_}")
    print(f"cross-validated accuracy: {search.best_score_:.3f}; held-out accuracy: {search.score(X_test, y_test):.3f}")


if __name__ == "__main__":
    main()
