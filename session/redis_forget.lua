-- Byte accounting shared by the scripts (see budget.go): prefix .. 'bytes'
-- is the total of the records, 'sz' and 'ow' map a session id to the size
-- and owner it was last charged as, 'ob' an owner to the bytes it holds.
-- The owner is the record's (field o), but 'ow' keeps its own copy: a key
-- Redis expired by itself has lost its fields, and its bytes must still
-- leave its owner's count. forget drops a session's charge; call it
-- wherever a session is deleted, and before charging it anew.
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
