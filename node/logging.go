package node

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/lni/dragonboat/v4/logger"
)

// dragonboat's logger is process-wide and can be installed once; it writes
// through the logger of the first node started in the process, at warn
// level and above.
var (
	dbLoggerOnce sync.Once
	dbLogger     atomic.Pointer[slog.Logger]
)

func installDragonboatLogger(l *slog.Logger) {
	dbLogger.CompareAndSwap(nil, l)
	dbLoggerOnce.Do(func() {
		logger.SetLoggerFactory(func(pkg string) logger.ILogger { return &dbLog{pkg: pkg} })
	})
}

type dbLog struct{ pkg string }

func (d *dbLog) log(level slog.Level, format string, args []any) {
	l := dbLogger.Load()
	if l == nil || !l.Enabled(context.Background(), level) {
		return
	}
	l.Log(context.Background(), level, fmt.Sprintf(format, args...), "component", "raft", "pkg", d.pkg)
}

func (d *dbLog) SetLevel(logger.LogLevel)            {}
func (d *dbLog) Debugf(format string, args ...any)   {}
func (d *dbLog) Infof(format string, args ...any)    {}
func (d *dbLog) Warningf(format string, args ...any) { d.log(slog.LevelWarn, format, args) }
func (d *dbLog) Errorf(format string, args ...any)   { d.log(slog.LevelError, format, args) }
func (d *dbLog) Panicf(format string, args ...any) {
	d.log(slog.LevelError, format, args)
	panic(fmt.Sprintf(format, args...))
}
