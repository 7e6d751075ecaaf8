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
-- or past its owner's share, before anything changes. The owner is the
-- record's (ARGV[10]); 'sz' and 'ow' hold what the session was charged
-- last, and to whom.
local pfx, id, owner = ARGV[8], ARGV[7], ARGV[10]
local size = string.len(ARGV[4])
local old = tonumber(redis.call('HGET', pfx .. 'sz', id) or '0')
local grow = size - old
if grow > 0 then
  local budget, share = tonumber(ARGV[14]), tonumber(ARGV[15])
  local total = tonumber(redis.call('GET', pfx .. 'bytes') or '0')
  if budget > 0 and total + grow > budget then
    return {4, 'budget', total}
  end
  if share > 0 and owner ~= '' then
    local ownerGrow = grow
    if (redis.call('HGET', pfx .. 'ow', id) or '') ~= owner then
      ownerGrow = size
    end
    local held = tonumber(redis.call('HGET', pfx .. 'ob', owner) or '0')
    if held + ownerGrow > share then
      return {4, 'share', held}
    end
  end
end
local isNew = redis.call('ZSCORE', KEYS[2], ARGV[7]) == false
local okey = ARGV[8] .. 'o:' .. owner
if isNew and owner ~= '' and tonumber(ARGV[11]) > 0 then
  -- The owner's set may still hold sessions Redis expired by itself.
  if ARGV[13] ~= '' then
    redis.call('ZREMRANGEBYSCORE', okey, '-inf', '(' .. ARGV[13])
  end
  if redis.call('ZCARD', okey) >= tonumber(ARGV[11]) then
    local oldest = redis.call('ZRANGE', okey, 0, 0, 'WITHSCORES')
    return {2, oldest[2] or ''}
  end
end
local max = tonumber(ARGV[6])
if isNew and max > 0 then
  -- Evict the least recently updated sessions to make room for this one,
  -- but only those idle past the floor (ARGV[12], a score; '' = any).
  local n = redis.call('ZCARD', KEYS[2])
  while n >= max do
    local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
    if #oldest == 0 then break end
    if ARGV[12] ~= '' and tonumber(oldest[2]) > tonumber(ARGV[12]) then
      return {3, oldest[2]}
    end
    redis.call('ZREM', KEYS[2], oldest[1])
    local skey = ARGV[8] .. 's:' .. oldest[1]
    local o = redis.call('HGET', skey, 'o')
    if o then redis.call('ZREM', ARGV[8] .. 'o:' .. o, oldest[1]) end
    local u = redis.call('HGET', skey, 'u')
    if u then redis.call('ZREM', ARGV[8] .. 'u:' .. u, oldest[1]) end
    redis.call('DEL', skey)
    forget(pfx, oldest[1])
    n = n - 1
  end
end
if owner ~= '' then
  redis.call('HSET', KEYS[1], 'v', ARGV[2], 'd', ARGV[4], 'o', owner)
else
  redis.call('HSET', KEYS[1], 'v', ARGV[2], 'd', ARGV[4])
end
-- The user's index (ARGV[16]; '' is the anonymous user): every session
-- is listed under its user, by last update.
redis.call('HSET', KEYS[1], 'u', ARGV[16])
local ukey = ARGV[8] .. 'u:' .. ARGV[16]
local ttl = tonumber(ARGV[5])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
else
  redis.call('PERSIST', KEYS[1])
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[7])
if owner ~= '' then
  redis.call('ZADD', okey, ARGV[3], ARGV[7])
  if ttl > 0 then redis.call('PEXPIRE', okey, ttl) end
end
redis.call('ZADD', ukey, ARGV[3], ARGV[7])
if ttl > 0 then redis.call('PEXPIRE', ukey, ttl) end
-- Charge the record's bytes to its owner (forget undoes the last charge).
forget(pfx, id)
redis.call('INCRBY', pfx .. 'bytes', size)
redis.call('HSET', pfx .. 'sz', id, size)
if owner ~= '' then
  redis.call('HSET', pfx .. 'ow', id, owner)
  redis.call('HINCRBY', pfx .. 'ob', owner, size)
end
return {1, redis.call('ZCARD', KEYS[2])}
