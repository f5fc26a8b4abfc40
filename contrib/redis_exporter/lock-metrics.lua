#!lua flags=no-writes,allow-stale
-- Collect script for redis_exporter (-script / REDIS_EXPORTER_SCRIPT): reads the lock module's
-- INFO section and returns name, value pairs, shaped so that the relabelling in
-- contrib/prometheus/prometheus.yml turns them into Prometheus-style series. The exporter
-- publishes each pair as a gauge `redis_script_values{key="NAME"} VALUE`; the names are:
--   lock_grants_total                        a counter field, as INFO names it
--   lock_oldest_wait_seconds                 a field in ms (lock_oldest_wait_ms), in seconds
--   lock_wait_seconds_bucket le=0.1          a histogram bucket (lock_wait_ms_le_100), le in s
--   lock_wait_seconds_bucket le=+Inf         the +Inf bucket: the histogram's count
--   lock_wait_seconds_count                  (lock_wait_ms_count)
--   lock_wait_seconds_sum                    (lock_wait_ms_sum), in seconds
-- Values are strings (the exporter parses them as floats), so seconds keep every ms digit.
-- Read-only (the flags make the server refuse a write) and cheap: one INFO call, which looks
-- once at each key with waiters, and a few string operations per field.

-- "1500" (ms) -> "1.5", "100" -> "0.1", "60000" -> "60", "7" -> "0.007", "-1" -> "-0.001":
-- exact, no floats.
local function seconds(ms)
  local sign, digits = string.match(ms, '^(-?)(%d+)$')
  local padded = string.rep('0', 4 - #digits) .. digits
  local s = string.sub(padded, 1, -4) .. '.' .. string.sub(padded, -3)
  s = (string.gsub(s, '0+$', ''))
  s = (string.gsub(s, '%.$', ''))
  if s == '0' then
    return s
  end
  return sign .. s
end

local out = {}
local function put(name, value)
  out[#out + 1] = name
  out[#out + 1] = value
end

local info = redis.call('INFO', 'lock')
-- Whole lines of integers only (INFO ends each line with CRLF).
for name, value in string.gmatch(info, '(lock_[%w_]+):(%-?%d+)\r?\n') do
  local base, le = string.match(name, '^(.+)_ms_le_(%d+)$')
  if base then
    put(base .. '_seconds_bucket le=' .. seconds(le), value)
  elseif string.match(name, '_ms_count$') then
    base = string.sub(name, 1, -10)
    put(base .. '_seconds_count', value)
    put(base .. '_seconds_bucket le=+Inf', value)
  elseif string.match(name, '_ms_sum$') then
    put(string.sub(name, 1, -8) .. '_seconds_sum', seconds(value))
  elseif string.match(name, '_ms$') then
    put(string.sub(name, 1, -4) .. '_seconds', seconds(value))
  else
    put(name, value)
  end
end
return out
