//go:build tools

package internal

import (
	_ "github.com/hashicorp/memberlist"
	_ "github.com/lni/dragonboat/v4"
	_ "github.com/lni/dragonboat/v4/statemachine"
	_ "github.com/lni/vfs"
	_ "github.com/vmihailenco/msgpack/v5"
	_ "go.uber.org/goleak"
)
