"""The AWS provider (:class:`AWS`): EC2 instances for a pool, reached over SSH.

``AWS`` is loaded on first use, so importing this package imports neither boto3 nor the
provider's modules; boto3 itself is imported only inside functions that call AWS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from skyward.providers.aws.provider import AWS

__all__ = ["AWS"]


def __getattr__(name: str) -> Any:
    if name == "AWS":
        from skyward.providers.aws.provider import AWS

        return AWS
    raise AttributeError(f"module 'skyward.providers.aws' has no attribute {name!r}")
