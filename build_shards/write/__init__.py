"""Write: turn one block of source items into finished shards, indexes and the block's record."""
