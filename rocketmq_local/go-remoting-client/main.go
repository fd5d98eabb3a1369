// Drive the Go client of RocketMQ (github.com/apache/rocketmq-client-go/v2) as a test peer
// of a proxy's remoting port.
//
// Built by `make interop-deps` into .cache/go-remoting-client/driver. Every client is built
// as an application builds it: a name server address (here the proxy's remoting address)
// and a group, nothing else changed but, for consumers, where a new group starts (the first
// offset). Output is JSON lines, as the Java and C++ remoting drivers': {"ready": true} once
// the client has started, then one result line, then exit 0.
//
//	produce --namesrv H:P --group PG --topic T --count N [--kind normal|orderly]
//	        [--order-keys K] [--body-prefix P]
//	    message i has the body "<P>-<i>" (P default "m"). orderly: key "k<i mod K>" (K
//	    default 4), sent with the client's hash queue selector on that key.
//	    -> {"sent": [{"body", "id", "broker", "queue", "status"}], "errors": [...]}
//	push --namesrv H:P --group G --topic T --expect N [--orderly] [--seconds S]
//	    a push consumer (concurrent, or orderly) of every tag of T from the first offset;
//	    stops once N distinct bodies were consumed, or after S seconds (default 60).
//	    -> {"messages": [{"body", "key", "broker", "queue", "offset", "reconsume",
//	        "at_ms"}], "errors": [...]}
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

type options struct {
	namesrv, group, topic, kind, bodyPrefix string
	count, orderKeys, expect                int
	orderly                                 bool
	seconds                                 float64
}

func emit(line any) {
	out, err := json.Marshal(line)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
}

func produce(o options) map[string]any {
	opts := []producer.Option{
		producer.WithNameServer([]string{o.namesrv}),
		producer.WithGroupName(o.group),
	}
	if o.kind == "orderly" {
		opts = append(opts, producer.WithQueueSelector(producer.NewHashQueueSelector()))
	}
	p, err := rocketmq.NewProducer(opts...)
	if err != nil {
		panic(err)
	}
	if err := p.Start(); err != nil {
		panic(err)
	}
	emit(map[string]bool{"ready": true})
	sent := []map[string]any{}
	errors := []string{}
	for i := 0; i < o.count; i++ {
		body := fmt.Sprintf("%s-%d", o.bodyPrefix, i)
		msg := primitive.NewMessage(o.topic, []byte(body))
		if o.kind == "orderly" {
			key := fmt.Sprintf("k%d", i%o.orderKeys)
			msg.WithKeys([]string{key})
			msg.WithShardingKey(key)
		}
		res, err := p.SendSync(context.Background(), msg)
		if err != nil {
			errors = append(errors, fmt.Sprintf("%s: %v", body, err))
			continue
		}
		status := "SEND_OK"
		if res.Status != primitive.SendOK {
			status = fmt.Sprintf("status %d", res.Status)
		}
		sent = append(sent, map[string]any{
			"body": body, "id": res.MsgID, "broker": res.MessageQueue.BrokerName,
			"queue": res.MessageQueue.QueueId, "status": status,
		})
	}
	_ = p.Shutdown()
	return map[string]any{"sent": sent, "errors": errors}
}

func push(o options) map[string]any {
	var mu sync.Mutex
	messages := []map[string]any{}
	bodies := map[string]bool{}
	enough := make(chan struct{})
	record := func(msgs []*primitive.MessageExt) {
		mu.Lock()
		defer mu.Unlock()
		for _, m := range msgs {
			body := string(m.Body)
			messages = append(messages, map[string]any{
				"body": body, "key": m.GetKeys(), "broker": m.Queue.BrokerName,
				"queue": m.Queue.QueueId, "offset": m.QueueOffset,
				"reconsume": m.ReconsumeTimes, "at_ms": time.Now().UnixMilli(),
			})
			if !bodies[body] {
				bodies[body] = true
				if len(bodies) == o.expect {
					close(enough)
				}
			}
		}
	}
	c, err := rocketmq.NewPushConsumer(
		consumer.WithNameServer([]string{o.namesrv}),
		consumer.WithGroupName(o.group),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumerOrder(o.orderly),
	)
	if err != nil {
		panic(err)
	}
	listener := func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		record(msgs)
		return consumer.ConsumeSuccess, nil
	}
	if err := c.Subscribe(o.topic, consumer.MessageSelector{}, listener); err != nil {
		panic(err)
	}
	if err := c.Start(); err != nil {
		panic(err)
	}
	emit(map[string]bool{"ready": true})
	select {
	case <-enough:
	case <-time.After(time.Duration(o.seconds * float64(time.Second))):
	}
	_ = c.Shutdown()
	mu.Lock()
	defer mu.Unlock()
	return map[string]any{"messages": messages, "errors": []string{}}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: driver produce|push --namesrv H:P --group G --topic T ...")
		os.Exit(2)
	}
	command := os.Args[1]
	var o options
	flags := flag.NewFlagSet(command, flag.ExitOnError)
	flags.StringVar(&o.namesrv, "namesrv", "", "the name server (the proxy's remoting port)")
	flags.StringVar(&o.group, "group", "", "the producer or consumer group")
	flags.StringVar(&o.topic, "topic", "", "the topic")
	flags.StringVar(&o.kind, "kind", "normal", "normal or orderly")
	flags.StringVar(&o.bodyPrefix, "body-prefix", "m", "the bodies' prefix")
	flags.IntVar(&o.count, "count", 0, "messages to send")
	flags.IntVar(&o.orderKeys, "order-keys", 4, "keys of an orderly producer")
	flags.IntVar(&o.expect, "expect", 0, "distinct bodies to consume")
	flags.BoolVar(&o.orderly, "orderly", false, "an orderly push consumer")
	flags.Float64Var(&o.seconds, "seconds", 60, "how long a consumer waits at most")
	if err := flags.Parse(os.Args[2:]); err != nil {
		panic(err)
	}
	// The client's log goes to the home directory, not stdout, where the results are.
	home, _ := os.UserHomeDir()
	_ = rlog.SetOutputPath(filepath.Join(home, "logs", "rocketmq-go.log"))
	rlog.SetLogLevel("info")
	var result map[string]any
	switch command {
	case "produce":
		result = produce(o)
	case "push":
		result = push(o)
	default:
		fmt.Fprintln(os.Stderr, "unknown command", command)
		os.Exit(2)
	}
	emit(result)
	os.Exit(0)
}
