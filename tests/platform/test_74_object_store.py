"""The stack's object store on the shared stack (docs/jobs.md, "Data on the object store"): its
endpoint on loopback with the keys as stack outputs (the secret one a Pulumi secret), anonymous
requests refused, `trainstack data put/ls`, and jobs that read `s3a://` from it: a small Parquet
set through the data stage's arrow path (pyarrow's S3 filesystem, no Spark SQL) and a CSV set
through Spark's s3a (hadoop-aws and the AWS SDK bundle on the nodes); a missing bucket is one
sentence before training. Runs in the warm runner that the first `up` left: about a minute."""

from __future__ import annotations

import json
import uuid

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import requests

from .cli import EXAMPLES, status, submit_and_follow, trainstack, wait_state
from .conftest import MODELS, sh

pytestmark = pytest.mark.e2e

REGRESSION = EXAMPLES / "regression"
PREFIX = f"tests-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def store(platform) -> dict:
    outputs = json.loads(platform.stack.run("stack", "output", "--json", "--show-secrets").stdout)
    return {
        "url": outputs["objectStoreUrl"],
        "bucket": outputs["objectStoreBucket"],
        "access_key": outputs["objectStoreAccessKey"],
        "secret_key": outputs["objectStoreSecretKey"],
    }


def test_endpoint_is_on_loopback_and_its_secret_key_a_pulumi_secret(platform, store):
    assert store["url"].startswith("http://127.0.0.1:"), store["url"]
    shown = platform.outputs()
    assert shown["objectStoreSecretKey"] == "[secret]", "the secret key is shown in plain text"
    assert len(store["secret_key"]) >= 32


def test_anonymous_requests_are_refused(store):
    listing = requests.get(store["url"] + "/", timeout=30)
    assert listing.status_code == 403, (listing.status_code, listing.text[:300])
    read = requests.get(f"{store['url']}/{store['bucket']}/", timeout=30)
    assert read.status_code == 403, (read.status_code, read.text[:300])
    put = requests.put(f"{store['url']}/{store['bucket']}/anonymous.txt", data=b"x", timeout=30)
    assert put.status_code == 403, (put.status_code, put.text[:300])


@pytest.fixture(scope="module")
def uploaded(platform, store, tmp_path_factory) -> dict[str, str]:
    """The regression example's data on the store: as Parquet, and as CSV (Spark's path)."""
    local = tmp_path_factory.mktemp("s3data")
    table = pq.read_table(REGRESSION / "data" / "diabetes.parquet")
    (local / "parquet").mkdir()
    pq.write_table(table, local / "parquet" / "part-0.parquet")
    pacsv.write_csv(table, local / "diabetes.csv")
    urls = {
        "parquet": f"s3://{store['bucket']}/{PREFIX}/diabetes/",
        "csv": f"s3://{store['bucket']}/{PREFIX}/csv/diabetes.csv",
    }
    for src, dest in ((local / "parquet", urls["parquet"]), (local / "diabetes.csv", urls["csv"])):
        put = trainstack(platform, "data", "put", str(src), dest)
        assert put.returncode == 0, put.stdout + put.stderr
    return urls


def test_data_put_and_ls_round_trip(platform, uploaded):
    listed = trainstack(platform, "data", "ls", uploaded["parquet"])
    assert listed.returncode == 0, listed.stderr
    assert "part-0.parquet" in listed.stdout, listed.stdout


def test_a_job_reads_small_parquet_from_the_store_without_spark_sql(platform, uploaded):
    data = uploaded["parquet"].replace("s3://", "s3a://", 1)
    record, _ = submit_and_follow(platform, REGRESSION, "--epochs", "2", "--data", data)
    _, text = sh(platform.container("control-3"), f"cat {MODELS}/{record['id']}/metrics.json")
    metrics = json.loads(text)
    assert metrics["data_path"] == "arrow", metrics.get("data_path")
    assert record["result"]["task"] == "regression", record["result"]


def test_a_job_reads_csv_from_the_store_through_spark_s3a(platform, uploaded):
    data = uploaded["csv"].replace("s3://", "s3a://", 1)
    record, _ = submit_and_follow(platform, REGRESSION, "--epochs", "2", "--data", data)
    _, text = sh(platform.container("control-3"), f"cat {MODELS}/{record['id']}/metrics.json")
    metrics = json.loads(text)
    assert metrics["data_path"] in ("driver", "spark"), metrics.get("data_path")
    assert record["result"]["task"] == "regression", record["result"]


def test_a_missing_bucket_is_one_sentence_before_training(platform):
    data = f"s3a://no-such-bucket-{uuid.uuid4().hex[:6]}/x/"
    submitted = trainstack(platform, "submit", str(REGRESSION), "--data", data)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    wait_state(platform, job_id, ("failed",), timeout=300)
    error = status(platform, job_id).get("error", "")
    assert data.split("/")[2] in error, error
    assert "Traceback" not in error and "at org." not in error and len(error.splitlines()) == 1
