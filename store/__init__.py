"""The store both server rooms use (ingest writes to it, query reads from it): the client pools (a
write never waits behind a reader), the store URL, the store's errors, the confinement of users'
SQL, the schema and its migrations, and the group commit's persistence. It imports neither ingest
nor query: a batch comes in as store.group.Batch, which ingest's ValidatedBatch satisfies."""
