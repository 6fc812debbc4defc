module example.com/letterbox-consume

go 1.24

require (
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)
