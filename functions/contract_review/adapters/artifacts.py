"""The artifact bucket (`Artifacts`): SSE on every write."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from contract_review.domain.errors import ReviewError
from contract_review.domain.ports import PresignedUpload

_MISSING_CODES = {"NoSuchKey", "NoSuchBucket", "AccessDenied", "404", "403"}


class S3Artifacts:
    def __init__(self, client: Any, bucket: str):
        self.client = client
        self.bucket = bucket

    def put_text(self, key: str, body: str, content_type: str = "application/json") -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=body.encode("utf-8"), ContentType=content_type,
                               ServerSideEncryption="AES256")

    def get_text(self, key: str) -> str:
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
        return body.decode("utf-8")

    def get_text_range(self, key: str, byte_start: int, byte_end: int) -> str:
        if byte_end <= byte_start:
            return ""
        body: bytes = self.client.get_object(Bucket=self.bucket, Key=key,
                                             Range=f"bytes={byte_start}-{byte_end - 1}")["Body"].read()
        return body.decode("utf-8")

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=key)  # a missing key: S3 answers 204 as well

    def list_keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]

    def read_uri(self, bucket: str, key: str, max_bytes: int | None = None) -> bytes:
        ranged = {} if max_bytes is None else {"Range": f"bytes=0-{max_bytes}"}  # max_bytes + 1 at most
        try:
            body: bytes = self.client.get_object(Bucket=bucket, Key=key, **ranged)["Body"].read()
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if ranged and (code == "InvalidRange" or status == 416):
                return b""  # S3 answers a range of an empty object with 416: the object is empty
            if code in _MISSING_CODES or status in (403, 404):
                raise ReviewError.of("input.document_missing", f"{code} for the referenced object",
                                     provider_code=code, http_status=status, step="intake.load") from exc
            raise
        return body

    def presign_download(self, key: str, expires_s: int, filename: str) -> str:
        """A presigned GET (a signature, no request to S3: a missing object is the holder's 404 from S3)."""
        return str(self.client.generate_presigned_url(
            "get_object", ExpiresIn=expires_s, Params={
                "Bucket": self.bucket, "Key": key, "ResponseContentDisposition": f'attachment; filename="{filename}"'}))

    def presign_upload(self, key: str, max_bytes: int, expires_s: int) -> PresignedUpload:
        """A presigned POST: S3 itself refuses a body outside 1..max_bytes (`content-length-range`) and any other
        key; the bucket's default encryption (SSE-S3) encrypts the upload."""
        post = self.client.generate_presigned_post(Bucket=self.bucket, Key=key, ExpiresIn=expires_s,
                                                   Conditions=[["content-length-range", 1, max_bytes]])
        return PresignedUpload(url=str(post["url"]), fields={k: str(v) for k, v in post["fields"].items()})
