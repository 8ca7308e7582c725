"""How many base exports a tenant may start in any hour: the start times of each tenant's
exports in a Redis sorted set, so every API process of a deployment counts the same starts;
counted and recorded by one Lua script, so two processes never both take the last one."""

from __future__ import annotations

import math
import time
import uuid

import redis

WINDOW_S = 3600
# KEYS[1]: the tenant's starts; ARGV: now (ms), the window (ms), the limit, a unique member.
# Returns 0 once the start is recorded, else the ms until the oldest start leaves the window.
_ADMIT = """
local window_start = tonumber(ARGV[1]) - tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', window_start)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) - window_start)
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 0
"""


class ExportQuotaExceeded(Exception):
    """The tenant has started its limit of exports within the window."""

    def __init__(self, limit: int, retry_after_s: int) -> None:
        super().__init__(f"{limit} base exports started within the last hour")
        self.limit, self.retry_after_s = limit, retry_after_s


class ExportQuota:
    """At most ``limit`` export starts per tenant within any ``window_s``; ``namespace``
    separates deployments sharing one Redis (their queue name)."""

    def __init__(self, connection: redis.Redis, namespace: str, limit: int,
                 window_s: int = WINDOW_S) -> None:
        self.limit, self.window_s, self.namespace = limit, window_s, namespace
        self._admit = connection.register_script(_ADMIT)

    def admit(self, tenant: str) -> None:
        """Record that ``tenant`` starts an export now, or raise ExportQuotaExceeded."""
        if self.limit == 0:
            raise ExportQuotaExceeded(0, self.window_s)
        now_ms = int(time.time() * 1000)
        wait_ms = int(self._admit(keys=[f"{self.namespace}:base-export-starts:{tenant}"],
                                  args=[now_ms, self.window_s * 1000, self.limit,
                                        f"{now_ms}-{uuid.uuid4().hex}"]))
        if wait_ms:
            raise ExportQuotaExceeded(self.limit, math.ceil(wait_ms / 1000))
