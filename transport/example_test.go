package transport_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockmesh/lockmesh/transport"
)

// Application methods and error codes; transport treats both as opaque.
const (
	methodKeepalive uint8  = 1
	codeNotLeader   uint16 = 100
)

func Example() {
	srv, err := transport.Listen("127.0.0.1:0", transport.Config{}, func(ctx context.Context, method uint8, body []byte) ([]byte, error) {
		if method != methodKeepalive {
			return nil, &transport.Error{Code: codeNotLeader, Message: "not the leader of this shard"}
		}
		return []byte("ack " + string(body)), nil
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()

	client, err := transport.NewClient(transport.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := client.Call(ctx, srv.Addr(), methodKeepalive, []byte("session 7"))
	fmt.Println(string(resp), err)

	_, err = client.Call(ctx, srv.Addr(), 2, nil)
	var e *transport.Error
	if errors.As(err, &e) && e.Code == codeNotLeader {
		fmt.Println("remote:", e.Message)
	}
	// Output:
	// ack session 7 <nil>
	// remote: not the leader of this shard
}

func ExampleClient_Call_retry() {
	client, err := transport.NewClient(transport.Config{DialTimeout: 100 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	// Nothing listens on port 1: the peer is unavailable. A request that is
	// idempotent (lockmesh requests carry a session and request id) can be
	// retried on another peer or after a pause.
	_, err = client.Call(context.Background(), "127.0.0.1:1", methodKeepalive, nil)
	fmt.Println(errors.Is(err, transport.ErrUnavailable))

	client.Close()
	_, err = client.Call(context.Background(), "127.0.0.1:1", methodKeepalive, nil)
	fmt.Println(errors.Is(err, transport.ErrClosed))
	// Output:
	// true
	// true
}
