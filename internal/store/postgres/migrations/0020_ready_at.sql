-- When a task was last made ready, by the transaction's clock. A claim
-- (which locks no queue: docs/architecture.md, "How writes scale") reads
-- its clock before it sees the tasks that writes committing meanwhile
-- made ready; it starts such a task no earlier than the moment it became
-- ready, so the attempt that freed the slot ends no later than the next
-- one starts, in the times recorded as well as in fact. Nullable, no
-- default: adding it rewrites nothing, and replicas of earlier versions
-- (which neither write nor read it) may run beside this one.
ALTER TABLE tasks ADD COLUMN ready_at BIGINT;
