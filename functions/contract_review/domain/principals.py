"""Who owns a job: the caller's principal, as the Job API binds it, and where that principal's uploads live.

The HTTP API's IAM authorization gives the caller's ARN (`requestContext.authorizer.iam.userArn`). For an
assumed role that ARN names the session (`arn:aws:sts::111122223333:assumed-role/Ingest/i-0abc`), and an ECS
task, a CI run or an instance that restarts gets a new session. So a job binds to the principal that
survives restarts (`canonical`):
- an assumed role: the role, session stripped (`arn:aws:sts::111122223333:assumed-role/Ingest`);
- except an IAM Identity Center role (`AWSReservedSSO_*`): there the session name is the person signed in,
  so it stays (two people sharing a permission set never see each other's jobs);
- an IAM user, the root user, a federated user, and anything this module does not recognise: as given.

A job bound before this rule (to a full session ARN) stays readable by that same session: `Caller.owns`
accepts the canonical principal and the ARN exactly as presented.

Uploads. Each principal has its own prefix, `uploads/principals/<owner>/` (`owner`: a hash of the canonical
principal, so no ARN appears in a key); the Job API and intake accept an `s3_uri` of an API job only there
(`input.document_forbidden` otherwise). Queue senders have no principal and never read under
`uploads/principals/` (see `admission.check_upload`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from contract_review.domain.keys import UPLOADS_PREFIX

PRINCIPAL_UPLOADS_PREFIX = f"{UPLOADS_PREFIX}principals/"
SSO_ROLE_PREFIX = "AWSReservedSSO_"
_ASSUMED_ROLE = re.compile(r"^arn:(?P<partition>aws[a-z-]*):sts::(?P<account>\d{12}):assumed-role/"
                           r"(?P<role>[^/]+)/(?P<session>.+)$")


def canonical(arn: str) -> str:
    """The principal a job binds to (module doc): the role of an assumed-role session, else the ARN as given."""
    m = _ASSUMED_ROLE.match(arn)
    if m is None or m["role"].startswith(SSO_ROLE_PREFIX):
        return arn
    return f"arn:{m['partition']}:sts::{m['account']}:assumed-role/{m['role']}"


def owner(principal: str) -> str:
    """The key segment of a principal's uploads: stable, opaque, the same for every session of one role."""
    return hashlib.sha256(canonical(principal).encode("utf-8")).hexdigest()[:32]


def uploads_prefix(principal: str) -> str:
    """`uploads/principals/<owner>/`: the only place the Job API and intake read a principal's uploads."""
    return f"{PRINCIPAL_UPLOADS_PREFIX}{owner(principal)}/"


@dataclass(frozen=True)
class Caller:
    """An authenticated caller: `arn` as presented, `principal` the one its jobs bind to."""

    arn: str

    @property
    def principal(self) -> str:
        return canonical(self.arn)

    def owns(self, bound: str | None) -> bool:
        """Whether a job (or batch) bound to `bound` is this caller's: bound to its canonical principal, or, for a
        job bound before sessions were stripped, to exactly this session."""
        return bound is not None and bound in (self.principal, self.arn)
