-- Byte accounting shared by the scripts (see budget.go): prefix .. 'bytes'
-- is the total of the records, 'sz' and 'ow' map a session id to its size
-- and owner, 'ob' an owner to the bytes it holds. forget drops a session's
-- share of them; call it wherever a session is deleted.
local function forget(pfx, id)
  local sz = tonumber(redis.call('HGET', pfx .. 'sz', id) or '0')
  local ow = redis.call('HGET', pfx .. 'ow', id)
  redis.call('HDEL', pfx .. 'sz', id)
  redis.call('HDEL', pfx .. 'ow', id)
  if sz > 0 then
    redis.call('DECRBY', pfx .. 'bytes', sz)
    if ow and ow ~= '' and redis.call('HINCRBY', pfx .. 'ob', ow, -sz) <= 0 then
      redis.call('HDEL', pfx .. 'ob', ow)
    end
  end
end
