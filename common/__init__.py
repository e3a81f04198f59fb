"""Small pieces shared by the gateway, the evaluator and loadgen: HTTP shapes (msgspec Structs),
the stream clock's definition, and statistics helpers. It imports nothing from the other packages,
so loadgen can use it and still talk to the gateway over HTTP only."""
