-- Deletes expired sessions; see expireScript in redis.go. Index scores are
-- milliseconds, so candidates are checked against their exact version; a
-- key Redis itself expired already is only dropped from the index.
local cands = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[4]))
local n = 0
for _, id in ipairs(cands) do
  local key = ARGV[3] .. 's:' .. id
  local v = redis.call('HGET', key, 'v')
  if (not v) or v < ARGV[2] then
    local o = redis.call('HGET', key, 'o')
    if o then redis.call('ZREM', ARGV[3] .. 'o:' .. o, id) end
    local u = redis.call('HGET', key, 'u')
    if u then redis.call('ZREM', ARGV[3] .. 'u:' .. u, id) end
    redis.call('DEL', key)
    redis.call('ZREM', KEYS[1], id)
    forget(ARGV[3], id)
    n = n + 1
  end
end
return n
