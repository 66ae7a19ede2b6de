-- Every event written updates each index of `attach_events`: two fewer. A volume's events are
-- found through the chain's index (`attach_events_chain`: a volume's few events, sorted) and an
-- attachment's through its volume's chain (`host/src/store/events.rs`, `list_query`); the
-- project's and the time indexes serve the other lists.
DROP INDEX attach_events_by_volume;
DROP INDEX attach_events_by_attachment;
