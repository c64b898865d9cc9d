package mesh

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	ok := Config{Name: "a", BindAddr: "127.0.0.1:0"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	def := DefaultConfig()
	def.Name = "a"
	if err := def.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for name, mutate := range map[string]func(*Config){
		"no name":            func(c *Config) { c.Name = "" },
		"bind no port":       func(c *Config) { c.BindAddr = "127.0.0.1" },
		"bind bad port":      func(c *Config) { c.BindAddr = "127.0.0.1:99999" },
		"bind hostname":      func(c *Config) { c.BindAddr = "localhost:0" },
		"advertise hostname": func(c *Config) { c.AdvertiseAddr = "example.com:7946" },
		"advertise no port":  func(c *Config) { c.AdvertiseAddr = "10.0.0.1" },
		"short key":          func(c *Config) { c.SecretKey = make([]byte, 15) },
		"meta too large":     func(c *Config) { c.Meta.RPCAddr = strings.Repeat("x", 300) },
		"negative timeout":   func(c *Config) { c.BroadcastTimeout = -time.Second },
		"negative members":   func(c *Config) { c.MaxMembers = -1 },
		"too many members":   func(c *Config) { c.MaxMembers = maxMaxMembers + 1 },
	} {
		c := ok
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Validate() = %v, want ErrInvalidConfig", name, err)
		}
		if _, err := Create(c); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Create() = %v, want ErrInvalidConfig", name, err)
		}
	}
	for _, key := range [][]byte{make([]byte, 16), make([]byte, 24), make([]byte, 32)} {
		c := ok
		c.SecretKey = key
		if err := c.Validate(); err != nil {
			t.Errorf("%d-byte key: %v", len(key), err)
		}
	}
}
