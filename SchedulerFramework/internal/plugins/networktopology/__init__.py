"""NetworkTopology: choosing the network domain a gang is placed in (pure logic)."""
