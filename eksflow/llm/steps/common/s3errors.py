"""S3 failures as one line: what failed, at which endpoint, and what to check; bad setup exits 2, outages exit 1.

botocore raises chained exceptions (urllib3's, then its own, then boto3's around them), which a step would print
as three tracebacks per attempt. `s3_errors` turns them into StepInputError (exit 2, never retried: a missing
bucket or prefix, refused or missing credentials, access denied) or StepFailedError (exit 1, retried: the endpoint
is down or slow, the service failed), each one line naming the endpoint.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

from eksflow.runtime.args import StepFailedError, StepInputError

CREDENTIALS_FIX = (
    "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE, or the IAM role of the pod's service account"
)
CLIENT_ERRORS: dict[str, tuple[bool, str]] = {  # S3 error code -> (bad input?, what it means and what to check)
    "NoSuchBucket": (True, "the bucket does not exist; check the bucket name, AWS_ENDPOINT_URL and AWS_REGION"),
    "NoSuchKey": (True, "no such object; check the key or prefix"),
    "404": (True, "no such object; check the key or prefix"),
    "NotFound": (True, "no such object; check the key or prefix"),
    "InvalidBucketName": (True, "the bucket name is invalid; check the s3:// URI"),
    "AccessDenied": (True, "access denied; grant the role s3:ListBucket, s3:GetObject and s3:PutObject on the bucket"),
    "403": (True, "access denied; grant the role s3:ListBucket, s3:GetObject and s3:PutObject on the bucket"),
    "AllAccessDisabled": (True, "all access to the bucket is disabled; check the bucket"),
    "InvalidAccessKeyId": (True, f"the access key is not known to the endpoint; {CREDENTIALS_FIX}"),
    "SignatureDoesNotMatch": (True, f"the secret key does not match the access key; {CREDENTIALS_FIX}"),
    "InvalidToken": (True, f"the session token is invalid; {CREDENTIALS_FIX}"),
    "AuthorizationHeaderMalformed": (True, "the request was signed for another region; set AWS_REGION to the bucket's"),
    "PermanentRedirect": (True, "the bucket is in another region; set AWS_REGION to the bucket's region"),
    "301": (True, "the bucket is in another region; set AWS_REGION to the bucket's region"),
    "ExpiredToken": (False, "the session token expired; a retry picks up refreshed credentials"),
    "RequestTimeTooSkewed": (False, "this machine's clock is off; check NTP"),
}
BAD_SETUP = ("NoCredentialsError", "PartialCredentialsError", "ProfileNotFound", "InvalidConfigError", "NoRegionError")
BAD_REQUEST = ("ParamValidationError", "InvalidS3AddressingStyleError", "InvalidEndpointConfigurationError")


def s3_endpoint() -> str:
    """Where S3 requests go: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS S3 in the configured region."""
    explicit = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "the default region"
    return explicit or f"AWS S3 in {region}"


@contextmanager
def s3_errors(action: str, uri: str) -> Iterator[None]:
    """Run a block of S3 calls; a botocore, boto3 or s3transfer failure leaves it as one explained line.

    `action` and `uri` say what was being done, e.g. ("listing", "s3://bucket/data").
    """
    try:
        yield
    except (StepInputError, StepFailedError):
        raise
    except Exception as err:
        explained = explain(err, action, uri)
        if explained is None:
            raise
        raise explained from None


def explain(err: BaseException, action: str, uri: str) -> StepInputError | StepFailedError | None:
    """The one-line error for an S3 failure, or None when `err` holds no AWS SDK error (a bug: keep its traceback)."""
    cause = _sdk_error(err)
    if cause is None:
        return None
    from botocore.exceptions import ClientError

    name = type(cause).__name__
    where = f"{action} {uri} failed"
    if isinstance(cause, ClientError):  # or a subclass the client made for one code, e.g. NoSuchBucket
        error = cause.response.get("Error", {})
        code = str(error.get("Code", "")) or "unknown"
        bad_input, meaning = CLIENT_ERRORS.get(code, (False, "the S3 service failed; retry, then check its status"))
        message = _one_line(str(error.get("Message", "")))
        text = f"{where}: {code}{f' ({message})' if message else ''} at {s3_endpoint()}: {meaning}"
        return StepInputError(text) if bad_input else StepFailedError(text)
    if name in BAD_SETUP:
        return StepInputError(f"{where}: {_one_line(str(cause))} (endpoint {s3_endpoint()}); {CREDENTIALS_FIX}")
    if name in BAD_REQUEST:
        return StepInputError(f"{where}: {_one_line(str(cause))}; check the s3:// URI and AWS_ENDPOINT_URL")
    url = urlsplit(str(getattr(cause, "kwargs", {}).get("endpoint_url") or ""))
    endpoint = f"{url.scheme}://{url.netloc}" if url.netloc else s3_endpoint()  # the server, not the request path
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ProxyConnectionError"):
        return StepFailedError(
            f"{where}: cannot connect to the S3 endpoint {endpoint}; check that it is up and that AWS_ENDPOINT_URL "
            "names it (a retry may succeed)"
        )
    if name == "SSLError":
        return StepInputError(
            f"{where}: TLS to the S3 endpoint {endpoint} failed; check AWS_ENDPOINT_URL and AWS_CA_BUNDLE"
        )
    if name == "CredentialRetrievalError":
        return StepFailedError(
            f"{where}: {_one_line(str(cause))}; the credential provider failed (a retry may succeed)"
        )
    return StepFailedError(
        f"{where}: {name} from the S3 endpoint {endpoint} ({_one_line(str(cause))}); the endpoint is slow or failing, "
        "a retry may succeed"
    )


def _sdk_error(err: BaseException) -> BaseException | None:
    """The innermost AWS SDK exception in `err`'s chain: boto3 wraps botocore's, which wraps urllib3's."""
    found = None
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        module = type(current).__module__
        if module.startswith("botocore"):
            return current  # botocore's own exception is the most specific one that names the cause
        if module.startswith(("boto3", "s3transfer")):
            found = current
            last = getattr(current, "last_exception", None)  # s3transfer's RetriesExceededError keeps it here
            if isinstance(last, BaseException):
                current = last
                continue
        current = current.__cause__ or current.__context__
    return found


def _one_line(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
