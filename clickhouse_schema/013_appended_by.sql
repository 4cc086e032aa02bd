-- Which token appended a turn (its token_id; '' for turns stored before this column, by
-- a save of a message the transcript did not hold, or by a bulk loader). It decides who
-- besides an admin may remove the turn: conversation.delete_message lets a writer
-- remove the turns its own token appended.
ALTER TABLE conversations {on_cluster} ADD COLUMN IF NOT EXISTS appended_by String DEFAULT '';
