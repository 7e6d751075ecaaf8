-- Compare-and-set of one session; see putScript in redis.go for the keys
-- and arguments. Runs atomically: no other command interleaves.
local cur = redis.call('HGET', KEYS[1], 'v')
if not cur then cur = '' end
if cur ~= ARGV[1] then
  -- A session expired by the store's clock counts as absent, so a caller
  -- that found it gone may start it afresh.
  local expired = ARGV[9] ~= '' and cur ~= '' and cur < ARGV[9]
  if not (ARGV[1] == '' and expired) then
    return {0, cur}
  end
end
-- The byte budget: refuse a write that grows what is held past the budget
-- or past its owner's share, before anything changes.
local pfx, id = ARGV[8], ARGV[7]
local size = string.len(ARGV[4])
local old, owner = 0, ARGV[10]
local szv = redis.call('HGET', pfx .. 'sz', id)
if szv then
  old = tonumber(szv)
  owner = redis.call('HGET', pfx .. 'ow', id) or ''
end
local grow = size - old
if grow > 0 then
  local budget, share = tonumber(ARGV[11]), tonumber(ARGV[12])
  local total = tonumber(redis.call('GET', pfx .. 'bytes') or '0')
  if budget > 0 and total + grow > budget then
    return {2, 'budget', total}
  end
  if share > 0 and owner ~= '' then
    local held = tonumber(redis.call('HGET', pfx .. 'ob', owner) or '0')
    if held + grow > share then
      return {2, 'share', held}
    end
  end
end
local isNew = redis.call('ZSCORE', KEYS[2], ARGV[7]) == false
local max = tonumber(ARGV[6])
if isNew and max > 0 then
  -- Evict the least recently updated sessions to make room for this one.
  local n = redis.call('ZCARD', KEYS[2])
  while n >= max do
    local oldest = redis.call('ZPOPMIN', KEYS[2])
    if #oldest == 0 then break end
    redis.call('DEL', ARGV[8] .. 's:' .. oldest[1])
    forget(pfx, oldest[1])
    n = n - 1
  end
end
redis.call('HSET', KEYS[1], 'v', ARGV[2], 'd', ARGV[4])
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('PERSIST', KEYS[1])
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[7])
redis.call('INCRBY', pfx .. 'bytes', grow)
redis.call('HSET', pfx .. 'sz', id, size)
if owner ~= '' then
  redis.call('HSET', pfx .. 'ow', id, owner)
  redis.call('HINCRBY', pfx .. 'ob', owner, grow)
end
return {1, redis.call('ZCARD', KEYS[2])}
