"""Schemathesis against the OpenAPI document, with a valid admin key, on a service of its
own: a bounded, deterministic run must find no 5xx, no response outside the documented
status codes, schemas and content types."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from service_harness import start_service, stop_service

CHECKS = ("not_a_server_error,response_schema_conformance,status_code_conformance,"
          "content_type_conformance")
EXAMPLES_PER_OPERATION = 10
# every valid request starts a real export of a preset's base (gigabytes for the large ones)
# in the background; its own tests cover it (tests/app/test_deploy.py)
BACKGROUND_EXPORT = "/v1/models/{name}/base"


def test_the_api_survives_schemathesis_within_its_schema(tmp_path, model_cache):
    # no worker: the jobs and fleets it makes stay queued rather than train beside the run
    service = start_service(tmp_path, model_cache, {}, workers=0)
    try:
        schemathesis = Path(sys.executable).with_name("st")
        done = subprocess.run(
            [str(schemathesis), "run", f"{service.url}/openapi.json",
             "--header", f"Authorization: Bearer {service.api_key}", "--checks", CHECKS,
             "--max-examples", str(EXAMPLES_PER_OPERATION), "--generation-deterministic",
             "--no-color", "--exclude-path", BACKGROUND_EXPORT],
            capture_output=True, text=True, timeout=900, cwd=tmp_path,  # its cache too
            env={**os.environ, "SCHEMATHESIS_HOOKS": ""})
        report = done.stdout[-4000:]
        assert done.returncode == 0, report
        assert " passed" in report and "failures" not in report.split("SUMMARY")[-1], report
    finally:
        stop_service(service)
    assert "Traceback" not in service.output.read_text()
