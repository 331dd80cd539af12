"""`cluster.slurm.*` as the config takes it: slurmrestd's address and the job's time limit, one line per problem."""

import pytest

from eksflow.errors import ConfigError
from eksflow.runtime.slurm import MAX_TIME_LIMIT_MIN
from tests.flagship import config


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("http://slurmrestd:99999", "a port of 1-65535"),
        ("http://slurmrestd:0", "the port must be 1-65535"),
        ("http://-:6820", "host '-' is neither a DNS name nor an IP address"),
        ("http://-", "host '-' is neither"),
        ("http://slurm-.svc:6820", "is neither"),
        ("http://10.0.0.256:6820", "host '10.0.0.256' is neither"),
        ("http://:6820", "host '' is neither"),
        ("http://slurmrestd\n:6820", "holds a space, control or non-ASCII character"),
        ("ftp://slurmrestd:6820", "slurmrestd's address alone"),
        ("http://slurmrestd:6820/slurm/v0.0.44", "slurmrestd's address alone"),
    ],
    ids=["port-99999", "port-0", "host-dash", "dash-only", "label-dash", "ipv4", "no-host", "newline", "ftp", "path"],
)
def test_a_url_that_names_no_slurmrestd_is_one_line_naming_the_setting(value, problem):
    with pytest.raises(ConfigError) as refused:
        config([f"cluster.slurm.url={value}"])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("cluster.slurm.url: ") and problem in line, line


@pytest.mark.parametrize(
    "value",
    [
        "http://slurm-restapi.slurm.svc.cluster.local:6820",
        "http://127.0.0.1:6820/",
        "https://[fd00::1]:6820",
        "http://localhost",
        "http://slurmrestd:65535",
    ],
    ids=["dns", "ipv4", "ipv6", "no-port", "top-port"],
)
def test_a_url_with_a_dns_name_or_ip_address_and_a_port_is_taken(value):
    assert config([f"cluster.slurm.url={value}"]).cluster.slurm.url == value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (str(10**23), f"less than or equal to {MAX_TIME_LIMIT_MIN}"),
        (str(MAX_TIME_LIMIT_MIN + 1), f"less than or equal to {MAX_TIME_LIMIT_MIN}"),
        ("true", "a valid integer"),
        ("1.5", "a valid integer"),
        ("-1", "greater than or equal to 0"),
    ],
    ids=["1e23", "over-a-year", "bool", "fraction", "negative"],
)
def test_a_time_limit_beyond_slurms_range_or_no_whole_number_is_refused(value, problem):
    with pytest.raises(ConfigError) as refused:
        config([f"cluster.slurm.time_limit_min={value}"])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("cluster.slurm.time_limit_min: ") and problem in line, line


def test_a_time_limit_in_range_is_taken():
    assert config([f"cluster.slurm.time_limit_min={MAX_TIME_LIMIT_MIN}"]).cluster.slurm.time_limit_min == 525600
