-- Collect script for redis_exporter (--script / REDIS_EXPORTER_SCRIPT): returns every field of
-- the lock module's INFO section as name, value pairs, which the exporter publishes as
--   redis_script_values{key="lock_grants_total"} 42
-- INFO's module sections are not part of `INFO ALL`, which is what the exporter reads by
-- itself. Read-only, O(1) apart from the INFO call (which looks once at each key with waiters).
local fields = {}
local info = redis.call('INFO', 'lock')
for name, value in string.gmatch(info, '(lock_[%w_]+):(%d+)') do
  fields[#fields + 1] = name
  fields[#fields + 1] = value
end
return fields
