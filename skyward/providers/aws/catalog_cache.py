"""A current AWS catalog: built from AWS's own APIs with the user's credentials, cached with its date.

``skyward catalog refresh`` calls :func:`refresh`, which asks one region for

1. every instance type and its accelerators (``DescribeInstanceTypes``: GPU model, count and
   memory per device, Trainium/Inferentia from ``NeuronInfo``);
2. its Linux on-demand prices (the Price List API, ``pricing:GetProducts``, served from
   us-east-1 for every region);
3. its current Linux spot prices (``DescribeSpotPriceHistory``, the lowest across zones),

and writes them to ``$SKYWARD_HOME/catalog/aws-<region>.json`` (``SKYWARD_HOME`` defaults to
``~/.skyward``) with the time it was fetched. A step AWS refuses (an IAM policy without
``pricing:GetProducts``, say) is recorded in the file and the bundled snapshot's prices are
kept for it, so a refresh never leaves the catalog worse than before.

:func:`current` is what plans read: the cached catalog of the region when there is one, else
the bundled snapshot; either way with a line saying where the prices come from and how old
they are (:func:`price_source`). :func:`spot_price` prices a launched spot instance (from the
cache only: the bundled snapshot has no spot prices).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from skyward._home import home
from skyward.providers.aws import catalog

__all__ = ["cache_path", "current", "instance_records", "on_demand_prices", "price_source", "refresh", "spot_price"]

BUNDLED_AS_OF = "2025-06-01"  # catalog.json's "prices_as_of"


def cache_path(region: str) -> Path:
    return home() / "catalog" / f"aws-{region}.json"


def instance_records(types: tuple[catalog.InstanceType, ...]) -> list[dict[str, Any]]:
    """Instance types as a cached catalog's ``instance_types`` holds them (JSON-ready)."""
    return [{"name": t.name, "vcpus": t.vcpus, "memory_gib": t.memory_gib, "gpu": t.gpu, "gpu_count": t.gpu_count,
             "gpu_memory_gib": t.gpu_memory_gib, "cuda": t.cuda, "arch": t.arch, "price_per_hour": t.price_per_hour}
            for t in types]


def refresh(ec2: Any, pricing: Any = None, *, profile: str | None = None, now: datetime | None = None) -> Path:
    """Fetch the region's catalog (see the module docstring) and write the cache; returns its path.

    ``ec2`` is an :class:`~skyward.providers.aws.ec2.EC2`; ``pricing`` a boto3 ``pricing``
    client (default: one in us-east-1, where the Price List API lives, from ``profile``'s session).
    """
    from skyward.errors import SkywardError

    now = now or datetime.now(UTC)
    types = [catalog.from_ec2_description(item) for page in ec2.pages("describe_instance_types", {})
             for item in page.get("InstanceTypes", [])]
    notes: dict[str, str] = {}
    try:
        on_demand = on_demand_prices(pricing, ec2.region, profile)
        notes["on_demand"] = f"AWS Price List API ({len(on_demand)} types)"
    except Exception as exc:  # noqa: BLE001 - recorded: the snapshot's prices are kept
        on_demand = {}
        notes["on_demand"] = f"unavailable ({type(exc).__name__}: {str(exc)[:160]}); the bundled snapshot's kept"
    try:
        spot = _spot_prices(ec2, [t.name for t in types])
        notes["spot"] = f"DescribeSpotPriceHistory ({len(spot)} types)"
    except SkywardError as exc:
        spot = {}
        notes["spot"] = f"unavailable ({str(exc)[:160]})"
    priced = tuple(replace(t, price_per_hour=on_demand.get(t.name, t.price_per_hour)) for t in types)
    data = {"region": ec2.region, "fetched_at": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "sources": notes,
            "instance_types": instance_records(priced), "spot_prices": spot}
    path = cache_path(ec2.region)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)
    return path


def on_demand_prices(pricing: Any, region: str, profile: str | None = None) -> dict[str, float]:
    """USD per hour of every instance type on demand in ``region`` (Linux, shared tenancy), from
    the AWS Price List API (``pricing``: a boto3 ``pricing`` client, or None for one of ``profile``)."""
    if pricing is None:
        from skyward._optional import require

        boto3 = require("boto3", "skyward catalog refresh")
        pricing = boto3.Session(profile_name=profile).client("pricing", region_name="us-east-1")
    filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
        ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"), ("preInstalledSw", "NA"),
        ("capacitystatus", "Used"), ("licenseModel", "No License required"))]
    prices: dict[str, float] = {}
    for page in pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
        for text in page.get("PriceList", []):
            item = json.loads(text) if isinstance(text, str) else text
            name = item.get("product", {}).get("attributes", {}).get("instanceType")
            for term in item.get("terms", {}).get("OnDemand", {}).values():
                for dimension in term.get("priceDimensions", {}).values():
                    usd = dimension.get("pricePerUnit", {}).get("USD")
                    if name and usd and float(usd) > 0:
                        prices[name] = float(usd)
    return prices


def _spot_prices(ec2: Any, names: list[str]) -> dict[str, float]:
    lowest: dict[str, float] = {}
    request = {"ProductDescriptions": ["Linux/UNIX"], "StartTime": datetime.now(UTC)}
    for page in ec2.pages("describe_spot_price_history", request):
        for item in page.get("SpotPriceHistory", []):
            name, price = item.get("InstanceType"), float(item.get("SpotPrice", 0) or 0)
            if name in names and price > 0:
                lowest[name] = min(price, lowest.get(name, price))
    return lowest


def _load(region: str) -> Mapping[str, Any] | None:
    try:
        return json.loads(cache_path(region).read_text())
    except (OSError, ValueError):
        return None


def current(region: str | None = None) -> tuple[tuple[catalog.InstanceType, ...], str]:
    """The region's cached catalog, else the bundled snapshot; and where its prices come from."""
    region = _region(region)
    data = _load(region)
    if data is None:
        return catalog.load_catalog(), price_source(region)
    types = tuple(catalog._from_record(r) for r in data.get("instance_types", []))
    return (types or catalog.load_catalog()), price_source(region)


def spot_price(region: str | None, name: str) -> float | None:
    """Type ``name``'s spot price in the region's cached catalog (the lowest across its zones
    when it was fetched), or None: no cache, or none for that type (the bundled snapshot has no
    spot prices)."""
    data = _load(_region(region)) or {}
    price = (data.get("spot_prices") or {}).get(name)
    return float(price) if price else None


def _region(region: str | None) -> str:
    return region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def price_source(region: str | None = None, today: date | None = None) -> str:
    """One line: where prices come from and how old they are."""
    region = _region(region)
    today = today or datetime.now(UTC).date()
    data = _load(region)
    if data is not None:
        fetched = datetime.strptime(data["fetched_at"], "%Y-%m-%dT%H:%M:%SZ").date()
        source = data.get("sources", {}).get("on_demand", "")
        return (f"{region} on-demand prices fetched {fetched} ({(today - fetched).days} days old; "
                f"{source}), cached in {cache_path(region)}")
    as_of = date.fromisoformat(BUNDLED_AS_OF)
    return (f"approximate us-east-1 on-demand prices from the bundled snapshot of {as_of} "
            f"({(today - as_of).days} days old; `skyward catalog refresh` fetches current ones)")
