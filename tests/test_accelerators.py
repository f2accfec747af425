"""Accelerator specs, the offline EC2 catalog, and instance-type selection."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from skyward import accelerators as acc
from skyward.accelerators import KNOWN, Accelerator, parse_accelerator
from skyward.errors import ConfigError
from skyward.providers.aws import catalog
from skyward.providers.aws.catalog import InstanceType, from_ec2_description, load_catalog, select

ROOT = Path(__file__).resolve().parents[1]


def names(types):
    return [t.name for t in types]


def best(accelerator=None, **kw):
    return select(load_catalog(), accelerator=accelerator, **kw)[0].name


# --------------------------------------------------------------------------- Accelerator


def test_constructors_build_canonical_accelerators():
    a = acc.A100(count=8, memory="80GB")
    assert a == Accelerator("A100", count=8, memory="80GB", cuda=True)
    assert a.memory_gb == 80.0
    assert acc.H100(count=8).count == 8
    assert acc.L4(4) == Accelerator("L4", 4)
    assert acc.T4() == Accelerator("T4", 1)
    for make in (acc.T4, acc.A10G, acc.L4, acc.L40S, acc.V100, acc.A100, acc.H100, acc.H200,
                 acc.Trainium, acc.Inferentia2):
        made = make()
        assert made.name == make.__name__
        assert made.name in KNOWN
        assert made.count == 1 and made.memory is None


def test_accelerator_is_frozen_hashable_and_picklable():
    a = acc.A100(count=8, memory="80GB")
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.count = 4  # type: ignore[misc]
    assert {a, acc.A100(count=8, memory="80GB")} == {a}
    assert pickle.loads(pickle.dumps(a)) == a


def test_cuda_flag_nvidia_vs_aws_silicon():
    for model in ("T4", "A10G", "L4", "L40S", "V100", "A100", "H100", "H200"):
        assert KNOWN[model].cuda is True
        assert Accelerator(model).cuda is True
    assert acc.Trainium().cuda is False
    assert acc.Inferentia2().cuda is False
    assert KNOWN["Trainium"].vendor == "AWS"
    # unknown names default to CUDA, and the flag can be overridden
    assert Accelerator("RTX4090").cuda is True
    assert Accelerator("MI300X", cuda=False).cuda is False


@pytest.mark.parametrize("text, gb", [
    ("80GB", 80.0), ("80G", 80.0), ("80 GiB", 80.0), ("24gb", 24.0), ("141GB", 141.0),
    ("81920MiB", 80.0), ("1TB", 1024.0), ("40", 40.0), (" 16 gib ", 16.0),
])
def test_memory_gb_parsing(text, gb):
    assert Accelerator("A100", memory=text).memory_gb == pytest.approx(gb)


def test_memory_gb_none_without_memory():
    assert acc.H100().memory_gb is None


@pytest.mark.parametrize("bad", ["lots", "80B", "GB", "-4GB", "0GB", ""])
def test_bad_memory_is_rejected(bad):
    with pytest.raises(ConfigError) as info:
        Accelerator("A100", memory=bad)
    assert info.value.parameter == "accelerator.memory"


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8", True])
def test_bad_count_in_constructor(bad):
    with pytest.raises(ConfigError) as info:
        acc.A100(count=bad)
    assert info.value.parameter == "accelerator.count"


def test_known_names_are_normalised():
    assert Accelerator("a100").name == "A100"
    assert Accelerator("trainium").name == "Trainium"
    assert Accelerator("SomethingNew").name == "SomethingNew"


# --------------------------------------------------------------------------- parse_accelerator


def test_parse_passthrough():
    assert parse_accelerator(None) is None
    a = acc.H100(count=8)
    assert parse_accelerator(a) is a


@pytest.mark.parametrize("text, expected", [
    ("A100", Accelerator("A100", 1)),
    ("H100:8", Accelerator("H100", 8)),
    ("L4:4", Accelerator("L4", 4)),
    ("T4", Accelerator("T4", 1)),
    ("a100", Accelerator("A100", 1)),
    ("h100:8", Accelerator("H100", 8)),
    ("l40s:2", Accelerator("L40S", 2)),
    ("a10g", Accelerator("A10G", 1)),
    (" V100 : 4 ", Accelerator("V100", 4)),
    ("TRAINIUM:16", Accelerator("Trainium", 16)),
    ("inferentia2", Accelerator("Inferentia2", 1)),
    ("H200:8", Accelerator("H200", 8)),
    ("A100-80GB:8", Accelerator("A100", 8, memory="80GB")),
    ("a100-40gb", Accelerator("A100", 1, memory="40gb")),
])
def test_parse_forms(text, expected):
    got = parse_accelerator(text)
    assert got == expected
    assert got.memory_gb == expected.memory_gb


def test_parse_every_known_name_in_any_case():
    for name in KNOWN:
        for spelled in (name, name.lower(), name.upper()):
            assert parse_accelerator(spelled) == Accelerator(name)
            assert parse_accelerator(f"{spelled}:3") == Accelerator(name, 3)


@pytest.mark.parametrize("bad", ["A100:0", "A100:-1", "A100:x", "A100:1.5", "A100:", "A100:8:2", "A100: "])
def test_parse_bad_counts(bad):
    with pytest.raises(ConfigError) as info:
        parse_accelerator(bad)
    assert info.value.parameter == "accelerator"
    assert info.value.got == bad
    assert "count" in str(info.value)


@pytest.mark.parametrize("bad", ["B200", "K80", "", "gpu", "A100-huge", 8, 1.0])
def test_parse_unknown_names_list_the_known_ones(bad):
    with pytest.raises(ConfigError) as info:
        parse_accelerator(bad)
    err = info.value
    assert err.parameter == "accelerator"
    assert err.got == bad
    message = str(err)
    assert message.startswith("invalid accelerator")
    for name in KNOWN:
        assert name in err.accepted
    assert "NAME[:COUNT]" in err.accepted
    assert isinstance(err, ValueError)  # ConfigError is a ValueError too


# --------------------------------------------------------------------------- catalog


def test_catalog_loads_and_is_cached():
    cat = load_catalog()
    assert isinstance(cat, tuple) and all(isinstance(t, InstanceType) for t in cat)
    assert load_catalog() is cat
    wanted = {
        "g4dn.xlarge", "g4dn.2xlarge", "g4dn.12xlarge", "g4dn.metal",
        "g5.xlarge", "g5.2xlarge", "g5.12xlarge", "g5.48xlarge",
        "g6.xlarge", "g6.12xlarge", "g6.48xlarge",
        "g6e.xlarge", "g6e.12xlarge", "g6e.48xlarge",
        "p3.2xlarge", "p3.8xlarge", "p4d.24xlarge", "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge",
        "trn1.2xlarge", "trn1.32xlarge", "inf2.xlarge",
        "t3.medium", "t3.large",
        "m7i.large", "m7i.xlarge", "m7i.2xlarge", "m7i.4xlarge", "m7i.8xlarge",
        "c7i.large", "c7i.xlarge", "c7i.2xlarge", "c7i.4xlarge",
        "r7i.large", "r7i.xlarge", "r7i.2xlarge",
    }
    assert wanted <= set(names(cat))
    assert len(set(names(cat))) == len(cat)


def test_catalog_entries_are_consistent():
    for t in load_catalog():
        assert t.vcpus > 0 and t.memory_gib > 0, t
        assert t.arch in ("x86_64", "arm64"), t
        assert t.price_per_hour is None or t.price_per_hour > 0, t
        if t.gpu is None:
            assert t.gpu_count == 0 and t.gpu_memory_gib is None and t.cuda is False, t
        else:
            assert t.gpu in KNOWN, t
            assert t.gpu_count >= 1 and t.gpu_memory_gib and t.gpu_memory_gib > 0, t
            assert t.cuda is KNOWN[t.gpu].cuda, t
            a = t.accelerator
            assert (a.name, a.count, a.cuda) == (t.gpu, t.gpu_count, t.cuda), t
            assert a.memory_gb == pytest.approx(t.gpu_memory_gib), t


def test_catalog_specific_entries():
    p4d, p4de = catalog.by_name("p4d.24xlarge"), catalog.by_name("p4de.24xlarge")
    assert (p4d.gpu, p4d.gpu_count, p4d.gpu_memory_gib) == ("A100", 8, 40.0)
    assert (p4de.gpu, p4de.gpu_count, p4de.gpu_memory_gib) == ("A100", 8, 80.0)
    assert p4d.price_per_hour < p4de.price_per_hour
    trn = catalog.by_name("trn1.32xlarge")
    assert (trn.gpu, trn.gpu_count, trn.cuda) == ("Trainium", 16, False)
    assert catalog.by_name("m7i.large").gpu is None
    assert catalog.by_name("nope.large") is None


def test_every_known_accelerator_is_in_the_catalog():
    models = {t.gpu for t in load_catalog()}
    assert set(KNOWN) <= models


# --------------------------------------------------------------------------- selection


def test_a100_80gb_selects_p4de():
    assert names(select(load_catalog(), accelerator=acc.A100(count=8, memory="80GB"))) == ["p4de.24xlarge"]
    assert best("A100-80GB:8") == "p4de.24xlarge"


def test_a100_without_memory_prefers_cheaper_p4d():
    assert names(select(load_catalog(), accelerator="A100:8")) == ["p4d.24xlarge", "p4de.24xlarge"]
    assert best(acc.A100(count=8)) == "p4d.24xlarge"
    assert best(acc.A100(count=8, memory="40GB")) == "p4d.24xlarge"


@pytest.mark.parametrize("request_, expected", [
    ("H100:8", "p5.48xlarge"),
    ("L4:4", "g6.12xlarge"),
    ("T4", "g4dn.xlarge"),
    ("t4:1", "g4dn.xlarge"),
    ("A10G", "g5.xlarge"),
    ("L40S:8", "g6e.48xlarge"),
    ("V100:4", "p3.8xlarge"),
    ("H200:8", "p5e.48xlarge"),
    ("Trainium", "trn1.2xlarge"),
    ("Trainium:16", "trn1.32xlarge"),
    ("Inferentia2", "inf2.xlarge"),
])
def test_gpu_selection(request_, expected):
    assert best(request_) == expected


def test_exact_count_first_then_larger():
    got = select(load_catalog(), accelerator="L4:4")
    assert [t.gpu_count for t in got] == [4, 8]
    # no 2-GPU L4 type: larger counts are offered, cheapest first
    assert names(select(load_catalog(), accelerator="L4:2")) == ["g6.12xlarge", "g6.48xlarge"]
    # an exact but expensive match still beats a cheaper larger one
    cands = [
        InstanceType("big", 8, 32, "T4", 4, 16.0, True, "x86_64", 1.0),
        InstanceType("exact", 8, 32, "T4", 2, 16.0, True, "x86_64", 5.0),
    ]
    assert names(select(cands, accelerator="T4:2")) == ["exact", "big"]


def test_gpu_memory_tolerates_gb_vs_gib():
    # EC2 reports an L4 as 22.35 GiB; "24GB" is what NVIDIA sells it as
    assert best(acc.L4(memory="24GB")) == "g6.xlarge"
    assert best(acc.L40S(memory="48GB")) == "g6e.xlarge"


def test_gpu_request_with_host_minimums():
    assert best("T4", vcpus=8) == "g4dn.2xlarge"
    assert best("T4", vcpus=16) == "g4dn.12xlarge"
    assert best("A10G", memory_gb=100) == "g5.12xlarge"


def test_unknown_price_sorts_last_then_by_size():
    cands = [
        InstanceType("unpriced-small", 4, 16, "L4", 1, 22.35, True, "x86_64", None),
        InstanceType("priced-big", 16, 64, "L4", 1, 22.35, True, "x86_64", 9.0),
        InstanceType("unpriced-tiny", 2, 8, "L4", 1, 22.35, True, "x86_64", None),
    ]
    assert names(select(cands, accelerator="L4")) == ["priced-big", "unpriced-tiny", "unpriced-small"]


def test_cpu_selection_cheapest_that_fits():
    cat = load_catalog()
    assert best() == "t3.medium"  # defaults: 2 vCPUs, 4 GiB
    assert best(vcpus=4) == "c7i.xlarge"
    assert best(vcpus=4, memory_gb=16) == "m7i.xlarge"
    assert best(vcpus=8, memory_gb=64) == "r7i.2xlarge"
    assert best(memory_gb=16) == "r7i.large"
    assert best(vcpus=32) == "m7i.8xlarge"
    got = select(cat, accelerator=None, vcpus=4, memory_gb=8)
    assert all(t.gpu is None and t.vcpus >= 4 and t.memory_gib >= 8 for t in got)
    prices = [t.price_per_hour for t in got]
    assert prices == sorted(prices)


def test_cpu_selection_never_returns_accelerated_types():
    for t in select(load_catalog(), accelerator=None, vcpus=2, memory_gb=1):
        assert t.gpu is None


def test_select_rejects_bad_minimums():
    for kw, parameter in [
        (dict(vcpus=0), "vcpus"), (dict(vcpus=-2), "vcpus"), (dict(vcpus=2.5), "vcpus"),
        (dict(memory_gb=0), "memory_gb"), (dict(memory_gb=-1.0), "memory_gb"),
        (dict(arch="sparc"), "arch"),
    ]:
        with pytest.raises(ConfigError) as info:
            select(load_catalog(), accelerator=None, **kw)
        assert info.value.parameter == parameter


def test_select_errors_name_the_parameter_and_list_what_exists():
    cat = load_catalog()
    with pytest.raises(ConfigError) as info:
        select(cat, accelerator="A100:16")
    assert info.value.parameter == "accelerator"
    assert "A100:8" in info.value.accepted and "H100:1/8" in info.value.accepted
    assert "at most 8" in str(info.value)

    with pytest.raises(ConfigError) as info:
        select(cat, accelerator=acc.A100(count=8, memory="160GB"))
    assert info.value.parameter == "accelerator"
    assert "40 or 80" in str(info.value)

    with pytest.raises(ConfigError) as info:
        select([t for t in cat if t.gpu != "H100"], accelerator="H100:8")
    assert info.value.parameter == "accelerator"
    assert "no candidate instance type has H100" in str(info.value)

    with pytest.raises(ConfigError) as info:
        select(cat, accelerator=None, vcpus=512)
    assert info.value.parameter == "vcpus"
    assert "m7i.8xlarge" in info.value.accepted

    with pytest.raises(ConfigError) as info:
        select(cat, accelerator=None, vcpus=4, memory_gb=4096)
    assert info.value.parameter == "memory_gb"

    with pytest.raises(ConfigError) as info:
        select(cat, accelerator="T4", vcpus=1000)
    assert info.value.parameter == "vcpus"

    with pytest.raises(ConfigError) as info:
        select(cat, accelerator=None, arch="arm64")
    assert info.value.parameter == "arch"

    with pytest.raises(ConfigError) as info:
        select(cat, accelerator="nope:2")
    assert info.value.parameter == "accelerator"


def test_select_arch_filter():
    graviton = InstanceType("m7g.large", 2, 8, arch="arm64", price_per_hour=0.08)
    cands = [*load_catalog(), graviton]
    assert best_of(cands, arch="arm64") == "m7g.large"
    assert best_of(cands, arch="aarch64") == "m7g.large"
    assert best_of(cands, arch="x86_64") == "t3.medium"
    assert best_of(cands, arch="amd64") == "t3.medium"


def best_of(cands, accelerator=None, **kw):
    return select(cands, accelerator=accelerator, **kw)[0].name


# --------------------------------------------------------------------------- EC2 API descriptions

P4DE_DESCRIPTION = {
    "InstanceType": "p4de.24xlarge",
    "CurrentGeneration": True,
    "SupportedUsageClasses": ["on-demand", "spot"],
    "ProcessorInfo": {"SupportedArchitectures": ["x86_64"], "SustainedClockSpeedInGhz": 3.0,
                      "Manufacturer": "Intel"},
    "VCpuInfo": {"DefaultVCpus": 96, "DefaultCores": 48, "DefaultThreadsPerCore": 2},
    "MemoryInfo": {"SizeInMiB": 1179648},
    "GpuInfo": {
        "Gpus": [{"Name": "A100", "Manufacturer": "NVIDIA", "Count": 8,
                  "MemoryInfo": {"SizeInMiB": 81920}}],
        "TotalGpuMemoryInMiB": 655360,
    },
    "NetworkInfo": {"NetworkPerformance": "4x 100 Gigabit", "EfaSupported": True},
}


def test_from_ec2_description_gpu():
    t = from_ec2_description(P4DE_DESCRIPTION)
    assert t.name == "p4de.24xlarge"
    assert (t.vcpus, t.memory_gib) == (96, 1152.0)
    assert (t.gpu, t.gpu_count, t.gpu_memory_gib, t.cuda, t.arch) == ("A100", 8, 80.0, True, "x86_64")
    # the EC2 API has no prices: merged from the catalog by name
    assert t.price_per_hour == catalog.by_name("p4de.24xlarge").price_per_hour
    assert t == catalog.by_name("p4de.24xlarge")
    assert names(select([t], accelerator=acc.A100(count=8, memory="80GB"))) == ["p4de.24xlarge"]


def test_from_ec2_description_unknown_type_has_no_price():
    d = {
        "InstanceType": "g6.4xlarge",
        "VCpuInfo": {"DefaultVCpus": 16},
        "MemoryInfo": {"SizeInMiB": 65536},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "GpuInfo": {"Gpus": [{"Name": "L4", "Manufacturer": "NVIDIA", "Count": 1,
                              "MemoryInfo": {"SizeInMiB": 22888}}], "TotalGpuMemoryInMiB": 22888},
    }
    t = from_ec2_description(d)
    assert t.price_per_hour is None
    assert t.gpu == "L4" and t.gpu_memory_gib == pytest.approx(22.35, abs=0.01)
    assert names(select([t, catalog.by_name("g6.xlarge")], accelerator="L4")) == ["g6.xlarge", "g6.4xlarge"]


def test_from_ec2_description_cpu_and_arm():
    d = {
        "InstanceType": "m7g.large",
        "VCpuInfo": {"DefaultVCpus": 2},
        "MemoryInfo": {"SizeInMiB": 8192},
        "ProcessorInfo": {"SupportedArchitectures": ["arm64"]},
    }
    t = from_ec2_description(d)
    assert (t.gpu, t.gpu_count, t.gpu_memory_gib, t.cuda, t.arch) == (None, 0, None, False, "arm64")
    i386 = from_ec2_description({**d, "InstanceType": "t2.micro",
                                 "ProcessorInfo": {"SupportedArchitectures": ["i386", "x86_64"]}})
    assert i386.arch == "x86_64"


def test_from_ec2_description_non_nvidia():
    trn = from_ec2_description({
        "InstanceType": "trn1.2xlarge",
        "VCpuInfo": {"DefaultVCpus": 8},
        "MemoryInfo": {"SizeInMiB": 32768},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "NeuronInfo": {"NeuronDevices": [{"Count": 1, "Name": "Trainium", "CoreInfo": {"Count": 2, "Version": 2},
                                          "MemoryInfo": {"SizeInMiB": 32768}}],
                       "TotalNeuronDeviceMemoryInMiB": 32768},
    })
    assert (trn.gpu, trn.gpu_count, trn.gpu_memory_gib, trn.cuda) == ("Trainium", 1, 32.0, False)
    assert trn.price_per_hour == catalog.by_name("trn1.2xlarge").price_per_hour
    amd = from_ec2_description({
        "InstanceType": "g4ad.xlarge",
        "VCpuInfo": {"DefaultVCpus": 4},
        "MemoryInfo": {"SizeInMiB": 16384},
        "ProcessorInfo": {"SupportedArchitectures": ["x86_64"]},
        "GpuInfo": {"Gpus": [{"Name": "Radeon Pro V520", "Manufacturer": "AMD", "Count": 1,
                              "MemoryInfo": {"SizeInMiB": 8192}}], "TotalGpuMemoryInMiB": 8192},
    })
    assert (amd.gpu, amd.cuda) == ("Radeon Pro V520", False)


# --------------------------------------------------------------------------- import weight


@pytest.mark.parametrize("module", ["skyward.accelerators", "skyward.providers.aws.catalog"])
def test_import_does_not_pull_boto3(module):
    code = f"import sys, {module}; print('boto3' in sys.modules or 'botocore' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_one_h100_plans_the_one_gpu_p5_4xlarge_not_the_eight_gpu_type():
    assert best("H100:1") == "p5.4xlarge"
    assert best("H100:8") == "p5.48xlarge"
