"""trainstack:target and the aws target's keys: every bad value named with what is allowed."""

from __future__ import annotations

import pytest

from infra.config import ConfigError, StackConfig
from infra.config.aws import require_aws

pytestmark = pytest.mark.unit

PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9wZXJhdG9yLWtleS1mb3ItdGVzdHM operator@laptop"


def test_docker_is_the_default_target_and_aws_keys_are_optional_for_it():
    config = StackConfig.from_mapping({})
    assert config.target == "docker"
    assert (config.aws_operator_cidr, config.aws_public_key) == ("", "")


def test_aws_keys_are_typed():
    config = StackConfig.from_mapping(
        {
            "awsRegion": "eu-central-1",
            "awsOperatorCidr": "203.0.113.0/24",
            "awsControlInstanceType": "t3.large",
            "awsWorkerInstanceType": "c7g.2xlarge",
            "awsPublicKey": PUBLIC_KEY,
            "awsDataVolumeGb": "200",
        }
    )
    assert (config.aws_region, config.aws_data_volume_gb) == ("eu-central-1", 200)
    require_aws(config)  # nothing missing


@pytest.mark.parametrize(
    ("raw", "fragments"),
    [
        (
            {"target": "ssh"},
            ["trainstack:target", "'ssh' provisions the servers", "empty", "docs/targets.md"],
        ),
        (
            {"target": "aws"},
            ["trainstack:target", "'aws' has only run under Pulumi's mocks", "use docker"],
        ),
        ({"target": "gcp"}, ["trainstack:target", "'gcp' is not a target", "allowed: docker, ssh"]),
        ({"awsRegion": "Frankfurt"}, ["trainstack:awsRegion", "'Frankfurt'", "eu-central-1"]),
        (
            {"awsOperatorCidr": "0.0.0.0/0"},
            ["trainstack:awsOperatorCidr", "'0.0.0.0/0'", "internet", "/8 or narrower"],
        ),
        ({"awsOperatorCidr": "203.0.113.7/24"}, ["'203.0.113.7/24'", "host bits", "/32"]),
        ({"awsOperatorCidr": "my-laptop"}, ["trainstack:awsOperatorCidr", "'my-laptop'"]),
        ({"awsWorkerInstanceType": "huge"}, ["trainstack:awsWorkerInstanceType", "'huge'"]),
        ({"awsControlInstanceType": "T3.Medium"}, ["trainstack:awsControlInstanceType"]),
        ({"awsDataVolumeGb": "0"}, ["trainstack:awsDataVolumeGb", "0", "1..16384"]),
        ({"awsDataVolumeGb": "lots"}, ["trainstack:awsDataVolumeGb", "'lots'", "not a int"]),
        ({"awsPublicKey": "AAAAC3Nza"}, ["trainstack:awsPublicKey", "'AAAAC3Nza'", ".pub"]),
        ({"awsPrivateKeyFile": "id_ed25519"}, ["trainstack:awsPrivateKeyFile", "relative"]),
    ],
)
def test_bad_values_are_named_with_what_is_allowed(raw, fragments):
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping(raw)
    for fragment in fragments:
        assert fragment in str(err.value)


def test_a_private_key_given_as_the_public_key_is_refused_and_never_shown():
    secret_body = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"
    pasted = (
        f"-----BEGIN OPENSSH PRIVATE KEY-----\n{secret_body}\n-----END OPENSSH PRIVATE KEY-----"
    )
    with pytest.raises(ConfigError) as err:
        StackConfig.from_mapping({"awsPublicKey": pasted})
    assert "trainstack:awsPublicKey: the value is a private key (not shown)" in str(err.value)
    assert secret_body not in str(err.value)


def test_the_aws_target_names_every_missing_key():
    with pytest.raises(ConfigError) as err:
        require_aws(StackConfig())
    text = str(err.value)
    assert "trainstack:awsOperatorCidr: not set" in text
    assert "trainstack:awsPublicKey: not set" in text
