"""Getting batches to the server: the batcher, the shipper, the disk spool, the writer and their counts."""
