"""The options of :class:`~skyward.AWS`, checked by one pydantic model when the provider is made.

Files (``ssh_key``, ``known_hosts``) are checked by :func:`login_files`; what needs AWS itself
(the region's offer, the AMI) by the provider. Imported on first use (it imports pydantic, see
:mod:`skyward._config`).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, model_validator

from skyward._config import STRICT, Flag, reject, strings, validate

__all__ = ["AWSOptions", "aws_options", "login_files"]


def _a_string(accepted: str) -> Any:
    """Refuse a non-string saying what is accepted (inside ``X | None`` pydantic would only
    say "Input should be a valid string": the field's description is out of its reach)."""

    def check(value: Any) -> Any:
        if not isinstance(value, str):
            reject(accepted, value)
        return value

    return BeforeValidator(check)


def _matching(pattern: str, accepted: str) -> Any:
    regex = re.compile(pattern)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            reject(accepted, value)
        return value

    return Annotated[str, _a_string(accepted), AfterValidator(check), Field(description=accepted)]


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        reject("an address range such as '203.0.113.7/32'", value)


def _session(value: Any) -> Any:
    if value is not None and not hasattr(value, "client"):
        reject("a boto3.Session", value)
    return value


def _ports(value: Any) -> Any:
    """8080, "9000-9010", (9000, 9010), or a list of them -> ((low, high), ...)."""
    accepted = 'TCP ports 1-65535: 8080, "9000-9010", or a list of them'
    items = value if isinstance(value, (list, tuple)) and not (
        len(value) == 2 and all(isinstance(v, int) for v in value) and isinstance(value, tuple)) else [value]
    out = []
    for item in items:
        if isinstance(item, tuple) and len(item) == 2:
            low, high = item
        elif isinstance(item, int) and not isinstance(item, bool):
            low = high = item
        elif isinstance(item, str) and re.fullmatch(r"\s*\d+\s*(-\s*\d+\s*)?", item):
            low, _, rest = item.partition("-")
            low, high = int(low), int(rest or low)
        else:
            reject(accepted, item)
        if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high <= 65535):
            reject(accepted, item)
        out.append((low, high))
    return tuple(out)


def _labels(value: dict[str, str]) -> dict[str, str]:
    for key in value:
        if not key or key.lower().startswith(("skyward:", "aws:")) or key == "Name":
            reject("tag names that are not Name and do not start with 'skyward:' or 'aws:'", key)
    return value


def _one_or_many(value: Any) -> Any:
    import os

    return [value] if isinstance(value, (str, os.PathLike)) else value


def _at_least(minimum: float, *, integer: bool = False) -> Any:
    what = "an integer" if integer else "a number"
    kind = int if integer else float
    return Annotated[kind, Field(ge=minimum, allow_inf_nan=False, description=f"{what} >= {minimum:g}")]


Region = _matching(r"[a-z]{2}(-[a-z]+)+-\d+", "an AWS region such as 'us-east-1'")
Zone = _matching(r"[a-z]{2}(-[a-z]+)+-\d+[a-z]", "an availability zone such as 'us-east-1a'")
InstanceType = _matching(r"[a-z0-9-]+\.[a-z0-9-]+", "an EC2 instance type such as 'g5.xlarge'")
AMI = _matching(r"ami-[0-9a-f]{8,17}|resolve:ssm:/.+",
                "an AMI id such as 'ami-0abc12345678def90' or 'resolve:ssm:/parameter/name'")
Subnet = _matching(r"subnet-[0-9a-f]{8,17}", "a subnet id such as 'subnet-0abc1234'")
LoginUser = _matching(r"[A-Za-z_][A-Za-z0-9_.-]*", "the AMI's login user name, e.g. 'ubuntu'")
LookupURL = _matching(r"https?://.+", "an http(s) URL answering with the caller's address")
Profile = Annotated[str, _a_string("the name of a profile in ~/.aws/config"),
                    Field(min_length=1, description="the name of a profile in ~/.aws/config")]
Root = _matching(r"/.*|~|~/.*", "an absolute path or one starting with ~/")
FindLinks = strings("a list of directories on the hosts or URLs", paths=True)
KnownHosts = Annotated[strings("at least one known_hosts file, or None", paths=True) | None,
                       BeforeValidator(_one_or_many)]


class AWSOptions(BaseModel):
    """``sky.AWS(...)``'s arguments, checked one by one, then against each other."""

    model_config = STRICT

    region: Region | None = None
    instance_type: InstanceType | None = None
    vcpus: Annotated[_at_least(1, integer=True) | None, Field(description="an integer >= 1 or None")] = None
    memory_gb: Annotated[_at_least(0.5) | None, Field(description="a number >= 0.5 or None")] = None
    arch: Annotated[Literal["x86_64", "arm64"] | None, Field(description="'x86_64', 'arm64' or None")] = "x86_64"
    allocation: Annotated[Literal["spot-if-available", "spot", "on-demand"],
                          Field(description="'spot-if-available' or 'spot' or 'on-demand'")] = "spot-if-available"
    ami: AMI | None = None
    subnet_id: Subnet | None = None
    public_ip: Annotated[bool | None, Field(description="True, False or None")] = None
    disk_gb: _at_least(8, integer=True) = 100
    disk_tier: Annotated[Literal["low", "medium", "high", "ultra", "best"] | None,
                         Field(description="'low', 'medium', 'high', 'ultra', 'best' or None")] = None
    ports: Annotated[tuple[tuple[int, int], ...], BeforeValidator(_ports),
                     Field(description='TCP ports to open to the client: 8080, "9000-9010", or a list of them')] = ()
    zone: Zone | None = None
    labels: Annotated[dict[str, str], AfterValidator(_labels),
                      Field(description="a mapping of tag names to values (not starting with 'skyward:' or "
                                        "'aws:')")] = {}
    idle_timeout: _at_least(60) = 600.0
    max_lifetime: Annotated[_at_least(300) | None, Field(description="a number >= 300 or None")] = 24 * 3600.0
    user: LoginUser = "ubuntu"
    known_hosts: KnownHosts = None
    ssh_cidr: Annotated[str, _a_string("an address range such as '203.0.113.7/32'"), AfterValidator(_cidr),
                        Field(description="an address range such as '203.0.113.7/32'")] | None = None
    allow_ssh_from_anywhere: Flag = False
    ip_lookup_url: LookupURL
    ssh_via: Annotated[Literal["auto", "public", "private"],
                       Field(description="'auto' or 'public' or 'private'")] = "auto"
    root: Root = "~/.skyward"
    find_links: FindLinks = ()
    no_index: Flag = False
    boot_timeout: _at_least(1) = 600.0
    bootstrap_timeout: _at_least(1) = 1800.0
    connect_timeout: _at_least(1) = 10.0
    session: Annotated[Any, AfterValidator(_session)] = None
    profile: Profile | None = None

    @model_validator(mode="after")
    def _together(self) -> AWSOptions:
        if self.max_lifetime is not None and self.max_lifetime < self.idle_timeout:
            raise _cross("max_lifetime", f"at least idle_timeout ({self.idle_timeout:g}s) or None", self.max_lifetime)
        if self.session is not None and self.profile is not None:
            raise _cross("profile", "None when a session is given (the session has its profile)", self.profile)
        if self.known_hosts == ():
            raise _cross("known_hosts", "at least one known_hosts file, or None", [])
        if (self.ssh_cidr is not None and ipaddress.ip_network(self.ssh_cidr).prefixlen == 0
                and not self.allow_ssh_from_anywhere):
            raise _cross("ssh_cidr", "a range of the addresses this client connects from, e.g. '203.0.113.7/32' "
                         "(or None: this client's public address); every address needs "
                         "allow_ssh_from_anywhere=True", self.ssh_cidr,
                         detail="it would open SSH on every node to the whole internet")
        return self


def _cross(parameter: str, accepted: str, got: Any, detail: str = "") -> ValueError:
    """A check across fields: a ConfigError, which :func:`validate` passes through unchanged."""
    from skyward.errors import ConfigError

    return ConfigError(parameter, accepted, got, detail=detail)


def aws_options(**values: Any) -> AWSOptions:
    """Validate ``sky.AWS``'s keyword arguments; raises ConfigError for the first bad one."""
    return validate(AWSOptions, values)



def login_files(ssh_key: Any, known_hosts: tuple[str, ...] | None
                ) -> tuple[str | None, str | None, tuple[str, ...] | None]:
    """``ssh_key``'s expanded path and public key (None, None without one) and the expanded
    ``known_hosts`` paths; raises ConfigError naming the parameter for a file that is not there."""
    import os

    from skyward.errors import ConfigError
    from skyward.providers.aws.keys import public_key_of
    from skyward.providers.ssh import key_file

    key = public = None
    if ssh_key is not None:
        key = key_file("ssh_key", ssh_key)
        public = public_key_of(key)
    if known_hosts is None:
        return key, public, None
    paths = tuple(os.path.expanduser(p) for p in known_hosts)
    for path in paths:
        if not os.path.isfile(path):
            raise ConfigError("known_hosts", "existing known_hosts files", path, detail="not found")
    return key, public, paths
